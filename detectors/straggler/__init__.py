"""Straggler: one rank persistently slower than its peers (:mod:`healthsvc_detectors.straggler.detector`).

- :mod:`~healthsvc_detectors.straggler.detector` — :class:`StragglerDetector`: the maths, its state and the
  block-vectorised recursions;
- :mod:`~healthsvc_detectors.straggler.reference` — which timing tells ranks apart, and the peer median;
- :mod:`~healthsvc_detectors.straggler.replay` — one rank's episode replayed step by step, and its findings.
"""
from healthsvc_detectors.straggler.detector import StragglerDetector

__all__ = ["StragglerDetector"]
