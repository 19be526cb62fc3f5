"""``loss_spike`` and ``grad_spike``: a sudden jump above a robust baseline (:mod:`detectors.spike.detector`).

- :mod:`~detectors.spike.detector` — :class:`SpikeDetector` and its two kinds, the severity
  policy, the state;
- :mod:`~detectors.spike.job` — the job-wide view: the cross-rank median against its baseline;
- :mod:`~detectors.spike.ranks` — the per-rank view: each rank against its usual place among peers.
"""
from detectors.spike.detector import SpikeDetector, LossSpikeDetector, GradSpikeDetector

__all__ = ["SpikeDetector", "LossSpikeDetector", "GradSpikeDetector"]
