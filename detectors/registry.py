"""Every streaming detector the service runs, by name, with its shape and how it is fed.

Names are the finding kinds they report (the hang detector reports both ``hang`` and ``stall``;
configure it under ``hang``). Roles:

- ``arrival``: a :class:`~healthsvc_detectors.base.BlockDetector` judged on every accepted batch, without
  waiting for other ranks (non-finite values: a NaN must page at once);
- ``aligned``: a :class:`~healthsvc_detectors.base.BlockDetector` fed per-step frames once every rank's
  record of a step is in (spikes, stragglers, slowdowns, outliers, divergence, the replica and
  resume checks);
- ``absence``: an :class:`~healthsvc_detectors.base.AbsenceDetector` fed arrivals, heartbeats, the world
  and the caller's clock (hang and stall).

The service builds its suite from this table (``healthsvc/monitor/suite.py``) and the
conformance suite (``tests/detectors/test_conformance.py``) runs every entry, so a detector added
here is served and checked without another list to keep. An entry carries what each kind it
reports means (:mod:`healthsvc_detectors.kinds`, declared on the detector class): :func:`register` adds
both, and every consumer reads them from there.

>>> sorted(name for name, entry in REGISTRY.items() if entry.role == "absence")
['hang']
>>> REGISTRY["loss_spike"].protocol.__name__
'BlockDetector'
>>> [k.name for k in REGISTRY["hang"].kinds]
['hang', 'stall']
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from healthsvc_detectors.base import AbsenceDetector, BlockDetector, Detector
from healthsvc_detectors.divergence import DivergenceDetector
from healthsvc_detectors import kinds as kind_table
from healthsvc_detectors.hang import HangDetector
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.non_finite import NonFiniteDetector
from healthsvc_detectors.rank_outlier import RankOutlierDetector
from healthsvc_detectors.replica import ReplicaMismatchDetector
from healthsvc_detectors.resume import ResumeMismatchDetector
from healthsvc_detectors.slowdown import SlowdownDetector
from healthsvc_detectors.spike import GradSpikeDetector, LossSpikeDetector
from healthsvc_detectors.straggler import StragglerDetector

Role = Literal["arrival", "aligned", "absence"]
ROLES: tuple[Role, ...] = ("arrival", "aligned", "absence")


@dataclass(frozen=True)
class Registered:
    """One detector of the registry: its name (a finding kind), class and role, and one set of
    non-default parameters (``alt_params``) the conformance checks run it with besides its
    defaults (:mod:`healthsvc_detectors.checks`), so a promise that holds only at the defaults fails."""

    name: str
    cls: type[Detector]
    role: Role
    alt_params: dict[str, Any] = field(default_factory=dict)

    @property
    def protocol(self) -> type:
        """The protocol the service calls it through: block or absence."""
        return AbsenceDetector if self.role == "absence" else BlockDetector

    @property
    def kinds(self) -> tuple[Kind, ...]:
        """What each finding kind it reports means (declared on the detector class)."""
        return self.cls.kinds


REGISTRY: dict[str, Registered] = {}


def register(entry: Registered) -> None:
    """Serve a detector: its entry, and the kinds it reports. A detector must declare at least
    the kind it is named for, and every field of each (a :class:`~healthsvc_detectors.kinds.Kind` has no
    defaults), so a kind can never be served with a meaning nobody wrote down."""
    declared = [k.name for k in entry.kinds]
    if entry.name not in declared:
        raise ValueError(f"{entry.cls.__name__} must declare the kind {entry.name!r} in its 'kinds'")
    for k in entry.kinds:
        kind_table.add(k)
    REGISTRY[entry.name] = entry


def unregister(name: str) -> None:
    """Take a detector and its kinds out again (a test's toy detector)."""
    entry = REGISTRY.pop(name)
    for k in entry.kinds:
        kind_table.remove(k.name)


for _entry in (
    Registered("non_finite", NonFiniteDetector, "arrival", {"global_fraction": 0.25}),
    Registered("loss_spike", LossSpikeDetector, "aligned", {"z_threshold": 4.0, "confirm_steps": 3}),
    Registered("grad_spike", GradSpikeDetector, "aligned", {"z_threshold": 4.0, "confirm_steps": 3}),
    Registered("straggler", StragglerDetector, "aligned", {"cusum_h": 10.0, "min_duration_s": 5.0}),
    Registered("slowdown", SlowdownDetector, "aligned", {"cusum_h": 10.0, "warmup_steps": 30}),
    Registered("hang", HangDetector, "absence", {"timeout_floor_s": 5.0, "collective_wait_s": 3.0}),
    Registered("rank_outlier", RankOutlierDetector, "aligned", {"window_steps": 50, "z_warning": 0.8}),
    Registered("divergence", DivergenceDetector, "aligned", {"alpha": 0.05, "warmup_steps": 150}),
    Registered("replica_mismatch", ReplicaMismatchDetector, "aligned", {"group_metric": "shard_group"}),
    Registered("resume_mismatch", ResumeMismatchDetector, "aligned", {"check_steps": 5, "rtol": 1e-3}),
):
    register(_entry)

# The built-in vocabulary, for schemas that enumerate it; live checks ask healthsvc_detectors.kinds.
FINDING_KINDS: tuple[str, ...] = kind_table.names()
