"""What a detector reports.

A finding names the first step that shows a problem, the ranks it blames (empty when run-wide),
a severity, and a unitless score in [0, 1] (0 = barely past the threshold's meaning of normal,
1 = as bad as the detector can say). ``evidence`` is a small JSON-serialisable dict with the numbers
behind the decision, for people and notebooks.

Identity: ``(kind, metric, ranks, step)`` is stable, so a replay of the same input yields findings
the service can deduplicate.  A finding with ``status="resolved"`` says a condition that was
reported earlier (same kind, metric and ranks) has cleared at ``step``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from healthsvc_detectors import kinds

Severity = Literal["info", "warning", "critical"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Finding:
    kind: str
    step: int
    ranks: tuple[int, ...] = ()
    severity: Severity = "warning"
    score: float = 0.0
    metric: str | None = None
    status: Literal["firing", "resolved"] = "firing"
    onset_step: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not kinds.known(self.kind):   # the kind is also the alert name: healthsvc_detectors.kinds
            raise ValueError(f"unknown finding kind {self.kind!r}; expected one of {kinds.names()}")
        if self.severity not in SEVERITY_ORDER:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def identity(self) -> tuple:
        """Stable identity used for deduplication across replays."""
        return (self.kind, self.metric, self.ranks, self.step, self.status)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "step": int(self.step),
            "ranks": [int(r) for r in self.ranks],
            "severity": self.severity,
            "score": float(self.score),
            "metric": self.metric,
            "status": self.status,
            "onset_step": None if self.onset_step is None else int(self.onset_step),
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        return cls(
            kind=d["kind"], step=int(d["step"]), ranks=tuple(int(r) for r in d.get("ranks", ())),
            severity=d.get("severity", "warning"), score=float(d.get("score", 0.0)),
            metric=d.get("metric"), status=d.get("status", "firing"),
            onset_step=d.get("onset_step"), evidence=dict(d.get("evidence") or {}),
        )
