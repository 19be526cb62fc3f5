"""Streaming detectors and the offline maths of training-run health.

Pure numpy/scipy: no HTTP, no storage, no clock reads, no run ids. The service composes these.

- The streaming detectors (one module or package each, all named in :mod:`healthsvc_detectors.registry`)
  have one of two shapes (:mod:`healthsvc_detectors.base`): a block detector consumes blocks of steps x
  ranks (:class:`~healthsvc_detectors.frame.StepBlock`), an absence detector arrivals and heartbeats on the
  caller's clock; both return :class:`~healthsvc_detectors.finding.Finding` objects.
- :mod:`healthsvc_detectors.stats` holds the robust statistics they share.
- :mod:`healthsvc_detectors.offline` the maths over a stored history: onset, rollback, bisection, economics.
"""
from healthsvc_detectors.finding import Finding, Severity
from healthsvc_detectors.frame import StepBlock
# Last: the registry imports every detector module, and with them the kinds they declare, so a
# Finding of any built-in kind is valid as soon as anything of this package is imported.
from healthsvc_detectors.registry import FINDING_KINDS

__all__ = ["Finding", "Severity", "FINDING_KINDS", "StepBlock"]
