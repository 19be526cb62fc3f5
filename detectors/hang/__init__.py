"""Hang and stall: silence, measured on the caller's clock (:mod:`detectors.hang.detector`).

- :mod:`~detectors.hang.detector` — :class:`HangDetector`: the definitions, its input and its tick;
- :mod:`~detectors.hang.state` — the per-rank table, the deadlines derived from it, its state;
- :mod:`~detectors.hang.judging` — who holds the job: the stall and hang findings and their words.
"""
from detectors.hang.detector import HangDetector

__all__ = ["HangDetector"]
