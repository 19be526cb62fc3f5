"""What the store knows about a run, as the typed records of :mod:`healthsvc_detectors.offline.economics`.

Times are the service's clock (when records, checkpoints, events and findings were stored), so
every duration is measured on one clock. Sources:

- attempts: the store's attempts, with their first/last push times, the ranks that pushed, the
  largest ``world_size`` the ranks reported and the median ``step_time``; kept per run in an
  incremental cache that decodes only chunks it has not seen (two columns of each);
- checkpoints: the registry (``deleted`` ones are left out, ``verified`` is verified clean,
  ``bad`` is known bad);
- incidents (failures for the MTBF): every attempt after the first (``restart``), the trainer's
  ``restart`` events, firing ``stall`` and ``non_finite`` findings, and ``corruption``: firing
  ``rank_outlier`` findings (the silent-corruption suspect) and the trainer's ``rollback`` events;
- corruptions (detection lag, retention, goodput): firing ``rank_outlier`` findings with an onset
  (detected at the finding's step and storage time; rollback target = the newest checkpoint
  before the onset written before detection), and ``rollback`` events (target = the event's step,
  onset = ``data.onset_step`` if sent, else the step after the target, detected at the step the
  abandoned attempt had reached).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from healthsvc_detectors import kinds as kind_table
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.offline.economics.records import (Attempt, CheckpointWrite, Corruption, Decision, Incident,
                                                  RunEvent)

_DECODE_FIELDS = {"step_time", "world_size"}


@dataclass
class _AttemptStats:
    start_s: float
    end_s: float
    ranks: set[int] = field(default_factory=set)
    world_size: int | None = None
    step_time_medians: list[float] = field(default_factory=list)  # one per chunk that had any


@dataclass
class _RunCache:
    last_chunk_id: int = 0
    attempts: dict[int, _AttemptStats] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class AttemptStatsCache:
    """Per-run attempt statistics, brought up to date from new chunks on each read."""

    def __init__(self, store) -> None:
        self.store = store
        self._runs: dict[str, _RunCache] = {}
        self._lock = threading.Lock()

    def attempts(self, run_id: str) -> list[Attempt]:
        with self._lock:
            cache = self._runs.setdefault(run_id, _RunCache())
        with cache.lock:
            for chunk in self.store.chunks_after(run_id, cache.last_chunk_id, _DECODE_FIELDS):
                chunk_id, attempt, received_at, batch = chunk.id, chunk.attempt, chunk.received_at, chunk.batch
                st = cache.attempts.get(attempt)
                if st is None:
                    st = cache.attempts[attempt] = _AttemptStats(received_at, received_at)
                st.end_s = max(st.end_s, received_at)
                st.ranks.update(np.unique(batch.ranks).tolist())
                if "world_size" in batch.values:
                    ws = batch.values["world_size"][batch.present["world_size"]]
                    ws = ws[np.isfinite(ws)]
                    if len(ws):
                        st.world_size = max(st.world_size or 0, int(ws.max()))
                if "step_time" in batch.values:
                    t = batch.values["step_time"][batch.present["step_time"]]
                    t = t[np.isfinite(t)]
                    if len(t):
                        st.step_time_medians.append(float(np.median(t)))
                cache.last_chunk_id = chunk_id
            stats = dict(cache.attempts)
        out = []
        for row in self.store.reads.attempts(run_id):
            st = stats.get(row["attempt"])
            if st is None:
                continue
            step_time = float(np.median(st.step_time_medians)) if st.step_time_medians else None
            out.append(Attempt(index=row["attempt"], start_s=st.start_s, end_s=st.end_s,
                               first_step=row["start_step"], last_step=row["last_step"],
                               ranks=frozenset(st.ranks), reported_world_size=st.world_size,
                               step_time_s=step_time))
        return out


@dataclass(frozen=True)
class RunFacts:
    run_id: str
    attempts: tuple[Attempt, ...]
    checkpoints: tuple[CheckpointWrite, ...]
    events: tuple[RunEvent, ...]
    findings: tuple[tuple[float, Finding], ...]
    incidents: tuple[Incident, ...]
    corruptions: tuple[Corruption, ...]
    per_rank_batch_size: int | None
    configured_world_size: int | None

    @property
    def current_step(self) -> int:
        """The last step of the run's newest attempt (its effective history's end)."""
        return self.attempts[-1].last_step if self.attempts else 0

    @property
    def exposure_s(self) -> float:
        """Run time over which failures could happen: the summed spans of the attempts."""
        return sum(a.end_s - a.start_s for a in self.attempts)

    @property
    def restart_downtimes_s(self) -> list[float]:
        return [max(0.0, b.start_s - a.end_s) for a, b in zip(self.attempts, self.attempts[1:])]

    @property
    def step_time_s(self) -> float | None:
        """The newest attempt's step time (the run's current pace), else any attempt's."""
        for a in reversed(self.attempts):
            if a.step_time_s is not None:
                return a.step_time_s
        return None


def _events(store, run_id: str) -> list[tuple[RunEvent, dict]]:
    """The trainer's events as typed records, each with its raw ``data``."""
    out = []
    for e in store.reads.events(run_id):
        d = e["data"] or {}
        old, new = d.get("old", d.get("old_world_size")), d.get("new", d.get("new_world_size"))
        event = RunEvent(kind=e["kind"], at_s=e["ts"], step=e["step"],
                         reason=d.get("reason") if isinstance(d.get("reason"), str) else None,
                         old_world_size=int(old) if isinstance(old, (int, float)) else None,
                         new_world_size=int(new) if isinstance(new, (int, float)) else None,
                         decision=_decision(d))
        out.append((event, d))
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _decision(d: dict) -> Decision | None:
    """The record a supervisor sent with its restart (``data.decided_by``); the event's data is
    the sender's, so each field is taken only when it has the type the supervisor writes."""
    if not isinstance(d.get("decided_by"), str):
        return None
    sizes = d.get("world_size")
    if not isinstance(sizes, dict):
        sizes = {}
    hosts = d.get("exclude_hosts")
    if not isinstance(hosts, list):
        hosts = []
    causes = [c for c in d.get("causes") or () if isinstance(c, list) and len(c) == 2
              and isinstance(c[0], str) and _int(c[1]) is not None] if isinstance(d.get("causes"), list) else []
    return Decision(decided_by=d["decided_by"],
                    reason_code=d["reason_code"] if isinstance(d.get("reason_code"), str) else None,
                    from_attempt=_int(d.get("from_attempt")),
                    checkpoint_step=_int(d.get("resume_from_checkpoint_step")),
                    checkpoint_uri=d["uri"] if isinstance(d.get("uri"), str) else None,
                    exclude_hosts=tuple(h for h in hosts if isinstance(h, str)),
                    old_world_size=_int(sizes.get("old")), new_world_size=_int(sizes.get("new")),
                    causes=tuple((c[0], c[1]) for c in causes))


def _step_reached(attempts: list[Attempt], at_s: float) -> int | None:
    """The highest step the attempt running at ``at_s`` had reached (its last step)."""
    reached = None
    for a in attempts:
        if a.start_s <= at_s:
            reached = a.last_step
    return reached


def load_run_facts(store, findings_service, cache: AttemptStatsCache, run_id: str) -> RunFacts:
    attempts = cache.attempts(run_id)
    ckpts = tuple(CheckpointWrite(step=c["step"], uri=c["uri"], written_at_s=c["created_at"],
                                  duration_s=c["duration_s"], size_bytes=c["bytes"],
                                  attempt=c["attempt"], verified_clean=c["status"] == "verified",
                                  known_bad=c["status"] == "bad")
                  for c in store.reads.checkpoints(run_id) if c["status"] != "deleted")
    raw_events = _events(store, run_id)
    events = [e for e, _ in raw_events]
    stored = findings_service.query(run_id, limit=1_000_000)
    findings = tuple((sf.created_at, sf.finding) for sf in stored)

    incidents = [Incident("restart", a.start_s, step=a.first_step, summary=f"attempt {a.index} started")
                 for a in attempts[1:]]
    incidents += [Incident("restart", e.at_s, step=e.step, summary=e.reason or "trainer restart event")
                  for e in events if e.kind == "restart"]
    corruptions: list[Corruption] = []
    for at_s, f in findings:
        if f.status != "firing":
            continue
        # What a finding is to the run's economics is its kind's ``incident`` (healthsvc_detectors.kinds).
        incident = kind_table.kind(f.kind).incident if kind_table.known(f.kind) else None
        if incident in ("stall", "non_finite"):
            incidents.append(Incident(incident, at_s, step=f.step, onset_step=f.onset_step,
                                      summary=f"{f.kind} finding"))
        elif incident == "corruption":
            onset = f.onset_step if f.onset_step is not None else f.step
            incidents.append(Incident("corruption", at_s, step=f.step, onset_step=onset,
                                      summary=f"{f.kind} on ranks {list(f.ranks)}"))
            before = [c for c in ckpts if c.step < onset and c.written_at_s <= at_s and not c.known_bad]
            target = max(before, key=lambda c: (c.step, c.written_at_s)).step if before else None
            corruptions.append(Corruption(onset_step=onset, detected_step=max(f.step, onset),
                                          detected_at_s=at_s, rollback_target_step=target))
    for e, raw in raw_events:
        if e.kind != "rollback" or e.step is None:
            continue
        raw_onset = raw.get("onset_step")
        onset = raw_onset if isinstance(raw_onset, int) else e.step + 1
        reached = _step_reached(attempts, e.at_s)
        detected = max(onset, reached if reached is not None else onset)
        incidents.append(Incident("corruption", e.at_s, step=detected, onset_step=onset,
                                  summary=f"rollback to step {e.step}"))
        corruptions.append(Corruption(onset_step=onset, detected_step=detected, detected_at_s=e.at_s,
                                      rollback_target_step=e.step))
    config = (store.reads.get_run_row(run_id) or {}).get("config") or {}
    return RunFacts(run_id=run_id, attempts=tuple(attempts), checkpoints=ckpts, events=tuple(events),
                    findings=findings, incidents=tuple(sorted(incidents, key=lambda i: i.at_s)),
                    corruptions=tuple(corruptions),
                    per_rank_batch_size=config.get("batch_size_per_rank"),
                    configured_world_size=config.get("world_size"))


def fleet_failures_and_exposure(store, exclude_run_id: str) -> tuple[int, float]:
    """Restarts and run time pooled over the other runs: the organisation-wide MTBF figure.

    Only restarts are counted here (an attempt after the first), which the store knows without
    decoding history; it is a prior, refined by each run's own incidents.
    """
    rows = store.reads.attempt_spans(exclude_run_id=exclude_run_id)
    exposure = sum(hi - lo for _, _, lo, hi in rows)
    attempts_by_run: dict[str, int] = {}
    for run_id, _, _, _ in rows:
        attempts_by_run[run_id] = attempts_by_run.get(run_id, 0) + 1
    failures = sum(n - 1 for n in attempts_by_run.values())
    return failures, exposure
