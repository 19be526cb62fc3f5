"""``loss_spike`` and ``grad_spike``: a sudden jump above a robust baseline (:mod:`healthsvc_detectors.spike.detector`).

- :mod:`~healthsvc_detectors.spike.detector` — :class:`SpikeDetector` and its two kinds, the severity
  policy, the state;
- :mod:`~healthsvc_detectors.spike.job` — the job-wide view: the cross-rank median against its baseline;
- :mod:`~healthsvc_detectors.spike.ranks` — the per-rank view: each rank against its usual place among peers.
"""
from healthsvc_detectors.spike.detector import SpikeDetector, LossSpikeDetector, GradSpikeDetector

__all__ = ["SpikeDetector", "LossSpikeDetector", "GradSpikeDetector"]
