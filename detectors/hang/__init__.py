"""Hang and stall: silence, measured on the caller's clock (:mod:`healthsvc_detectors.hang.detector`).

- :mod:`~healthsvc_detectors.hang.detector` — :class:`HangDetector`: the definitions, its input and its tick;
- :mod:`~healthsvc_detectors.hang.state` — the per-rank table, the deadlines derived from it, its state;
- :mod:`~healthsvc_detectors.hang.judging` — who holds the job: the stall and hang findings and their words.
"""
from healthsvc_detectors.hang.detector import HangDetector

__all__ = ["HangDetector"]
