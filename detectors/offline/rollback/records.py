"""What the rollback decision reads and what it answers: checkpoints, restarts, the decision.

A checkpoint at step ``c`` holds the state after the update of step ``c`` (DESIGN.md); its
``verdict`` is a probe's answer when there was one. A restart says where training resumed.
The decision says which checkpoint to resume from and why (:mod:`healthsvc_detectors.offline.rollback`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from healthsvc_detectors.offline.onset import OnsetEstimate

CheckpointStatus = Literal["ok", "deleted", "verified"]
Verdict = Literal["good", "bad"]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint record: ``status`` ``verified`` means a probe found it good; ``verdict`` holds
    a probe's answer (``good``/``bad``) when there was one."""

    step: int
    uri: str = ""
    status: CheckpointStatus = "ok"
    verdict: Verdict | None = None

    def __post_init__(self) -> None:
        if self.status not in ("ok", "deleted", "verified"):
            raise ValueError(f"checkpoint status must be ok, deleted or verified; got "
                             f"{self.status!r}")
        if self.verdict not in (None, "good", "bad"):
            raise ValueError(f"checkpoint verdict must be good, bad or None; got {self.verdict!r}")

    @property
    def known_good(self) -> bool:
        return self.verdict == "good" or (self.verdict is None and self.status == "verified")

    @property
    def known_bad(self) -> bool:
        return self.verdict == "bad"

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "uri": self.uri, "status": self.status,
                "verdict": self.verdict}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Checkpoint":
        return cls(step=int(d["step"]), uri=str(d.get("uri", "")),
                   status=d.get("status", "ok"), verdict=d.get("verdict"))


@dataclass(frozen=True)
class RollbackDecision:
    """Where to resume: ``checkpoint`` (None when no checkpoint is safe) and why.

    ``skip_data_range`` is an inclusive ``(start, end)`` range of steps whose batches to skip on
    replay, when the evidence points at the data. ``conservative`` is True when the onset interval
    made the decision pass over checkpoints that are probably clean (a bisection can recover them:
    ``evidence["bisect_candidates"]``).
    """

    checkpoint: Checkpoint | None
    onset: OnsetEstimate | None
    reason: str
    conservative: bool = False
    skip_data_range: tuple[int, int] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": None if self.checkpoint is None else self.checkpoint.to_dict(),
            "onset": None if self.onset is None else self.onset.to_dict(),
            "reason": self.reason,
            "conservative": self.conservative,
            "skip_data_range": None if self.skip_data_range is None else list(self.skip_data_range),
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Restart:
    """A restart: ``first_step`` is the first step trained after it, ``from_step`` the checkpoint
    step it resumed from when the trainer said so (else the newest checkpoint before
    ``first_step``)."""

    first_step: int
    from_step: int | None = None
