"""One ordered timeline per run, built from what the service recorded.

Entries (``kind``): ``attempt_started`` / ``attempt_ended`` (restarts are attempts after the
first; ``resumed_from_step`` is the step before the attempt's first one), ``world_size_change``
(from a trainer event, or ``source="detected"`` when the world size the ranks show — the
``world_size`` they report, else how many ranks pushed — differs from the previous attempt's
and no event said so), ``checkpoint``, ``finding``, ``incident`` and the trainer's other
``event`` kinds (``restart``, ``rollback``, ``config_change``, ``note``).

Effective batch size = world size × per-rank batch size, when the per-rank batch is known.

Order: by time; at equal times attempt starts first, attempt ends last, so a checkpoint written
at an attempt's last second sits inside it.

Example: eight ranks, a crash, six ranks come back without telling anyone.
    >>> tl = build_timeline(attempts=[
    ...     Attempt(0, 0.0, 100.0, 0, 99, ranks=frozenset(range(8))),
    ...     Attempt(1, 130.0, 200.0, 90, 159, ranks=frozenset(range(6)))],
    ...     per_rank_batch_size=32)
    >>> [(e.kind, e.step) for e in tl.entries]  # doctest: +NORMALIZE_WHITESPACE
    [('attempt_started', 0), ('attempt_ended', 99), ('attempt_started', 90),
     ('world_size_change', 90), ('attempt_ended', 159)]
    >>> change = tl.entries[3]
    >>> change.old_world_size, change.new_world_size, change.new_effective_batch_size, change.source
    (8, 6, 192, 'detected')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence, Union

from healthsvc_detectors.finding import Finding
from healthsvc_detectors.offline.economics.records import Attempt, CheckpointWrite, Incident, RunEvent

# A trainer's world_size_change event explains a detected change when it is this close in time.
EVENT_MATCH_SLACK_S = 300.0


def _batch(world_size: int | None, per_rank_batch_size: int | None) -> int | None:
    if world_size is None or per_rank_batch_size is None:
        return None
    return int(world_size) * int(per_rank_batch_size)


@dataclass(frozen=True)
class AttemptStarted:
    kind: ClassVar[str] = "attempt_started"
    at_s: float
    step: int
    attempt: int
    world_size: int | None
    effective_batch_size: int | None
    is_restart: bool
    downtime_s: float | None  # since the previous attempt ended

    @property
    def resumed_from_step(self) -> int | None:
        return self.step - 1 if self.is_restart else None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": self.at_s, "step": self.step, "attempt": self.attempt,
                "world_size": self.world_size, "effective_batch_size": self.effective_batch_size,
                "is_restart": self.is_restart, "resumed_from_step": self.resumed_from_step,
                "downtime_s": self.downtime_s}


@dataclass(frozen=True)
class AttemptEnded:
    kind: ClassVar[str] = "attempt_ended"
    at_s: float
    step: int
    attempt: int
    steps: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": self.at_s, "step": self.step, "attempt": self.attempt,
                "steps": self.steps}


@dataclass(frozen=True)
class WorldSizeChange:
    kind: ClassVar[str] = "world_size_change"
    at_s: float
    step: int | None
    attempt: int | None
    old_world_size: int | None
    new_world_size: int | None
    old_effective_batch_size: int | None
    new_effective_batch_size: int | None
    source: str  # "event" (the trainer said so) or "detected" (from which ranks pushed)
    ranks_lost: tuple[int, ...] = ()
    ranks_added: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": self.at_s, "step": self.step, "attempt": self.attempt,
                "old_world_size": self.old_world_size, "new_world_size": self.new_world_size,
                "old_effective_batch_size": self.old_effective_batch_size,
                "new_effective_batch_size": self.new_effective_batch_size,
                "source": self.source, "ranks_lost": list(self.ranks_lost),
                "ranks_added": list(self.ranks_added)}


@dataclass(frozen=True)
class CheckpointEntry:
    kind: ClassVar[str] = "checkpoint"
    at_s: float
    step: int
    attempt: int | None
    uri: str
    duration_s: float | None
    size_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": self.at_s, "step": self.step, "attempt": self.attempt,
                "uri": self.uri, "duration_s": self.duration_s, "size_bytes": self.size_bytes}


@dataclass(frozen=True)
class FindingEntry:
    kind: ClassVar[str] = "finding"
    at_s: float
    step: int
    attempt: int | None
    finding: Finding = field(compare=False)

    def to_dict(self) -> dict[str, Any]:
        f = self.finding
        return {"kind": self.kind, "at_s": self.at_s, "step": self.step, "attempt": self.attempt,
                "finding_kind": f.kind, "severity": f.severity, "status": f.status,
                "metric": f.metric, "ranks": [int(r) for r in f.ranks],
                "onset_step": f.onset_step, "score": f.score}


@dataclass(frozen=True)
class IncidentEntry:
    kind: ClassVar[str] = "incident"
    at_s: float
    step: int | None
    attempt: int | None
    incident: Incident

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": self.at_s, "step": self.step, "attempt": self.attempt,
                "incident_kind": self.incident.kind, "onset_step": self.incident.onset_step,
                "summary": self.incident.summary}


@dataclass(frozen=True)
class EventEntry:
    kind: ClassVar[str] = "event"
    at_s: float
    step: int | None
    attempt: int | None
    event: RunEvent

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": self.at_s, "step": self.step, "attempt": self.attempt,
                "event_kind": self.event.kind, "reason": self.event.reason,
                "decision": self.event.decision.to_dict() if self.event.decision else None}


TimelineEntry = Union[AttemptStarted, AttemptEnded, WorldSizeChange, CheckpointEntry,
                      FindingEntry, IncidentEntry, EventEntry]

# Tie-break at equal times: what opens an attempt first, what closes it last.
_KIND_ORDER = {"attempt_started": 0, "world_size_change": 1, "event": 2, "checkpoint": 3,
               "finding": 4, "incident": 5, "attempt_ended": 6}


@dataclass(frozen=True)
class RunTimeline:
    entries: tuple[TimelineEntry, ...]
    attempts: tuple[Attempt, ...]

    def of_kind(self, kind: str) -> list[TimelineEntry]:
        return [e for e in self.entries if e.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        return {"attempts": len(self.attempts), "restarts": max(0, len(self.attempts) - 1),
                "world_size_changes": len(self.of_kind("world_size_change")),
                "entries": [e.to_dict() for e in self.entries]}


def _attempt_at(order: Sequence[Attempt], at_s: float) -> int | None:
    """The attempt running at ``at_s`` (or the last one started before it)."""
    current = None
    for a in order:
        if a.start_s <= at_s:
            current = a.index
    return current


def _world_size_entries(order: Sequence[Attempt], events: Sequence[RunEvent],
                        per_rank_batch_size: int | None,
                        initial_world_size: int | None) -> list[WorldSizeChange]:
    reported = [e for e in events if e.kind == "world_size_change"]
    entries = [WorldSizeChange(
        at_s=e.at_s, step=e.step, attempt=_attempt_at(order, e.at_s),
        old_world_size=e.old_world_size, new_world_size=e.new_world_size,
        old_effective_batch_size=_batch(e.old_world_size, per_rank_batch_size),
        new_effective_batch_size=_batch(e.new_world_size, per_rank_batch_size),
        source="event") for e in reported]
    previous, previous_ranks, previous_end = initial_world_size, None, None
    for a in order:
        size = a.world_size
        if size is not None and previous is not None and size != previous:
            lo = (previous_end if previous_end is not None else a.start_s) - EVENT_MATCH_SLACK_S
            hi = a.end_s + EVENT_MATCH_SLACK_S
            explained = any(e.new_world_size == size and lo <= e.at_s <= hi for e in reported)
            if not explained:
                lost = tuple(sorted(previous_ranks - a.ranks)) if previous_ranks and a.ranks else ()
                added = tuple(sorted(a.ranks - previous_ranks)) if previous_ranks and a.ranks else ()
                entries.append(WorldSizeChange(
                    at_s=a.start_s, step=a.first_step, attempt=a.index,
                    old_world_size=previous, new_world_size=size,
                    old_effective_batch_size=_batch(previous, per_rank_batch_size),
                    new_effective_batch_size=_batch(size, per_rank_batch_size),
                    source="detected", ranks_lost=lost, ranks_added=added))
        if size is not None:
            previous, previous_ranks, previous_end = size, a.ranks, a.end_s
    return entries


def build_timeline(*, attempts: Sequence[Attempt] = (), checkpoints: Sequence[CheckpointWrite] = (),
                   events: Sequence[RunEvent] = (),
                   findings: Sequence[tuple[float, Finding]] = (),
                   incidents: Sequence[Incident] = (), per_rank_batch_size: int | None = None,
                   initial_world_size: int | None = None) -> RunTimeline:
    """Merge everything known about a run into one time-ordered timeline.

    ``findings`` are ``(at_s, finding)`` pairs: when the service emitted each finding.
    ``initial_world_size`` (e.g. from the run config) lets the first attempt's world size be
    compared too.
    """
    order = sorted(attempts, key=lambda a: (a.start_s, a.index))
    entries: list[TimelineEntry] = []
    previous_end = None
    for n, a in enumerate(order):
        entries.append(AttemptStarted(
            at_s=a.start_s, step=a.first_step, attempt=a.index, world_size=a.world_size,
            effective_batch_size=_batch(a.world_size, per_rank_batch_size), is_restart=n > 0,
            downtime_s=None if previous_end is None else max(0.0, a.start_s - previous_end)))
        entries.append(AttemptEnded(at_s=a.end_s, step=a.last_step, attempt=a.index,
                                    steps=a.steps))
        previous_end = a.end_s
    entries += _world_size_entries(order, events, per_rank_batch_size, initial_world_size)
    entries += [CheckpointEntry(at_s=c.written_at_s, step=c.step,
                                attempt=c.attempt if c.attempt is not None
                                else _attempt_at(order, c.written_at_s),
                                uri=c.uri, duration_s=c.duration_s, size_bytes=c.size_bytes)
                for c in checkpoints]
    entries += [FindingEntry(at_s=t, step=f.step, attempt=_attempt_at(order, t), finding=f)
                for t, f in findings]
    entries += [IncidentEntry(at_s=i.at_s, step=i.step, attempt=_attempt_at(order, i.at_s),
                              incident=i) for i in incidents]
    entries += [EventEntry(at_s=e.at_s, step=e.step, attempt=_attempt_at(order, e.at_s), event=e)
                for e in events if e.kind != "world_size_change"]
    entries.sort(key=lambda e: (e.at_s, _KIND_ORDER[e.kind],
                                e.step if e.step is not None else -1))
    return RunTimeline(entries=tuple(entries), attempts=tuple(order))
