"""Typed inputs of the run-economics functions: what the service knows about a run.

These are plain frozen dataclasses, built by the service from its store (or by a notebook from
the read API) and consumed by :mod:`timeline`, :mod:`advice`, :mod:`retention` and
:mod:`goodput`. Times are unix seconds (``*_s`` when a duration, ``*_at_s`` when a moment),
steps are optimizer-update indices as on the wire.

Example:
    >>> Attempt(index=0, start_s=0.0, end_s=600.0, first_step=0, last_step=599,
    ...         ranks=frozenset(range(8)), step_time_s=1.0).world_size
    8
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# Incidents that count as a failure for the mean time between failures: each of them ends
# (or should end) an attempt and costs a restart from a checkpoint.
FAILURE_KINDS: tuple[str, ...] = ("restart", "stall", "non_finite", "corruption")

IncidentKind = Literal["restart", "stall", "hang", "non_finite", "corruption", "other"]


@dataclass(frozen=True)
class CheckpointWrite:
    """One checkpoint the trainer registered.

    ``written_at_s`` orders checkpoints (steps repeat after a rollback, write times do not).
    ``verified_clean`` is True only when a probe confirmed the checkpoint good; ``known_bad``
    when someone marked it corrupted.
    """

    step: int
    uri: str
    written_at_s: float
    duration_s: float | None = None
    size_bytes: int | None = None
    attempt: int | None = None
    verified_clean: bool = False
    known_bad: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": int(self.step), "uri": self.uri, "written_at_s": float(self.written_at_s),
            "duration_s": self.duration_s, "size_bytes": self.size_bytes,
            "attempt": self.attempt, "verified_clean": bool(self.verified_clean),
            "known_bad": bool(self.known_bad),
        }


@dataclass(frozen=True)
class Attempt:
    """One attempt of a run: from a (re)start to the last record before the next one.

    ``ranks`` is the set of ranks that pushed in this attempt; ``reported_world_size`` is the
    ``world_size`` the ranks themselves reported, when they did. ``step_time_s`` is the typical
    (median) wall time of one training step in this attempt, excluding checkpoint writes.
    """

    index: int
    start_s: float
    end_s: float
    first_step: int
    last_step: int
    ranks: frozenset[int] = frozenset()
    reported_world_size: int | None = None
    step_time_s: float | None = None

    @property
    def world_size(self) -> int | None:
        """The reported world size if any rank sent one, else the number of ranks that pushed."""
        if self.reported_world_size is not None:
            return int(self.reported_world_size)
        return len(self.ranks) or None

    @property
    def steps(self) -> int:
        return max(0, self.last_step - self.first_step + 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "start_s": self.start_s, "end_s": self.end_s,
            "first_step": self.first_step, "last_step": self.last_step,
            "world_size": self.world_size, "step_time_s": self.step_time_s,
        }


@dataclass(frozen=True)
class Incident:
    """A grouped problem the service recorded (not every finding: one per occurrence).

    ``onset_step`` is the first step the problem affected when known (corruption: the first
    corrupted update), ``step`` the step at which it was detected.
    """

    kind: IncidentKind
    at_s: float
    step: int | None = None
    onset_step: int | None = None
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": self.at_s, "step": self.step,
                "onset_step": self.onset_step, "summary": self.summary}


@dataclass(frozen=True)
class Corruption:
    """A detected silent corruption: it began with the update of ``onset_step`` (the
    conservative, earliest estimate) and was detected at ``detected_step`` / ``detected_at_s``.
    ``rollback_target_step`` is the checkpoint the service told the trainer to resume from.

    Its detection lag is ``detected_step - onset_step`` steps.
    """

    onset_step: int
    detected_step: int
    detected_at_s: float
    rollback_target_step: int | None = None

    @property
    def lag_steps(self) -> int:
        return max(0, self.detected_step - self.onset_step)

    def to_dict(self) -> dict[str, Any]:
        return {"onset_step": self.onset_step, "detected_step": self.detected_step,
                "detected_at_s": self.detected_at_s, "lag_steps": self.lag_steps,
                "rollback_target_step": self.rollback_target_step}


@dataclass(frozen=True)
class Decision:
    """Who decided a restart and what it changed: the record ``healthsvc supervise`` posts with
    its ``rollback``/``restart`` event (docs/supervise.md), so the timeline can say it."""

    decided_by: str
    reason_code: str | None = None
    from_attempt: int | None = None
    checkpoint_step: int | None = None
    checkpoint_uri: str | None = None
    exclude_hosts: tuple[str, ...] = ()
    old_world_size: int | None = None
    new_world_size: int | None = None
    causes: tuple[tuple[str, int], ...] = ()     # (finding kind, step) of what caused it

    def to_dict(self) -> dict[str, Any]:
        return {"decided_by": self.decided_by, "reason_code": self.reason_code,
                "from_attempt": self.from_attempt, "checkpoint_step": self.checkpoint_step,
                "checkpoint_uri": self.checkpoint_uri, "exclude_hosts": list(self.exclude_hosts),
                "old_world_size": self.old_world_size, "new_world_size": self.new_world_size,
                "causes": [{"kind": k, "step": s} for k, s in self.causes]}


@dataclass(frozen=True)
class RunEvent:
    """An event the trainer sent (``POST /v1/runs/{run}/events``), see ``healthsvc_client.wire.EVENT_KINDS``.

    ``step``: for ``rollback`` the checkpoint step resumed from; otherwise the step at the event.
    """

    kind: str
    at_s: float
    step: int | None = None
    reason: str | None = None
    old_world_size: int | None = None
    new_world_size: int | None = None
    decision: Decision | None = None    # a supervised restart's record, else None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": self.at_s, "step": self.step, "reason": self.reason,
                "old_world_size": self.old_world_size, "new_world_size": self.new_world_size,
                "decision": self.decision.to_dict() if self.decision else None}
