"""Every streaming detector the service runs, by name, with its shape and how it is fed.

Names are the finding kinds they report (the hang detector reports both ``hang`` and ``stall``;
configure it under ``hang``). Roles:

- ``arrival``: a :class:`~detectors.base.BlockDetector` judged on every accepted batch, without
  waiting for other ranks (non-finite values: a NaN must page at once);
- ``aligned``: a :class:`~detectors.base.BlockDetector` fed per-step frames once every rank's
  record of a step is in (spikes, stragglers, slowdowns, outliers, divergence);
- ``absence``: an :class:`~detectors.base.AbsenceDetector` fed arrivals, heartbeats, the world
  and the caller's clock (hang and stall).

The service builds its suite from this table (``healthsvc/monitor/suite.py``) and the
conformance suite (``tests/detectors/test_conformance.py``) runs every entry, so a detector added
here is served and checked without another list to keep.

>>> sorted(name for name, entry in REGISTRY.items() if entry.role == "absence")
['hang']
>>> REGISTRY["loss_spike"].protocol.__name__
'BlockDetector'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from detectors.base import AbsenceDetector, BlockDetector, Detector
from detectors.divergence import DivergenceDetector
from detectors.hang import HangDetector
from detectors.non_finite import NonFiniteDetector
from detectors.rank_outlier import RankOutlierDetector
from detectors.slowdown import SlowdownDetector
from detectors.spike import GradSpikeDetector, LossSpikeDetector
from detectors.straggler import StragglerDetector

Role = Literal["arrival", "aligned", "absence"]
ROLES: tuple[Role, ...] = ("arrival", "aligned", "absence")


@dataclass(frozen=True)
class Registered:
    """One detector of the registry: its name (a finding kind), class and role."""

    name: str
    cls: type[Detector]
    role: Role

    @property
    def protocol(self) -> type:
        """The protocol the service calls it through: block or absence."""
        return AbsenceDetector if self.role == "absence" else BlockDetector


REGISTRY: dict[str, Registered] = {r.name: r for r in (
    Registered("non_finite", NonFiniteDetector, "arrival"),
    Registered("loss_spike", LossSpikeDetector, "aligned"),
    Registered("grad_spike", GradSpikeDetector, "aligned"),
    Registered("straggler", StragglerDetector, "aligned"),
    Registered("slowdown", SlowdownDetector, "aligned"),
    Registered("rank_outlier", RankOutlierDetector, "aligned"),
    Registered("divergence", DivergenceDetector, "aligned"),
    Registered("hang", HangDetector, "absence"),
)}
