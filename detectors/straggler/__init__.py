"""Straggler: one rank persistently slower than its peers (:mod:`detectors.straggler.detector`).

- :mod:`~detectors.straggler.detector` — :class:`StragglerDetector`: the maths, its state and the
  block-vectorised recursions;
- :mod:`~detectors.straggler.reference` — which timing tells ranks apart, and the peer median;
- :mod:`~detectors.straggler.replay` — one rank's episode replayed step by step, and its findings.
"""
from detectors.straggler.detector import StragglerDetector

__all__ = ["StragglerDetector"]
