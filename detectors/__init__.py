"""Streaming detectors and onset maths for training-run health.

Pure numpy/scipy: no HTTP, no storage, no clock reads, no run ids. The service composes these.
Every detector consumes blocks of steps x ranks (:class:`~detectors.frame.StepBlock`) and returns
:class:`~detectors.finding.Finding` objects.
"""
from detectors.finding import Finding, Severity, FINDING_KINDS
from detectors.frame import StepBlock

__all__ = ["Finding", "Severity", "FINDING_KINDS", "StepBlock"]
