"""Stored findings as the service uses them: recorded by the run's owner (the monitor), queried by
the API, run health, rollback and economics; folded into alerts, before the job that stores them,
by the stage alerting sets.

The table and its SQL are the store's (:mod:`healthsvc.store.findings`); a finding's identity is
:mod:`healthsvc.identity`'s, so a replay after a restart never stores or announces one twice.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, Protocol, Sequence

from healthsvc_detectors.finding import Finding
from healthsvc.identity import condition_key, occurrence_key
from healthsvc.store.findings import FindingsRecorded, StoredFinding
from healthsvc.store.interface import Store
from healthsvc.store.ops import Ops

__all__ = ["AlertStage", "FindingsRecorded", "FindingsService", "StoredFinding"]

log = logging.getLogger(__name__)

# One finding as its recorder folds it: the finding, the host of each rank it blames (None where
# unknown), and when the input that raised it reached the service (None: not known).
Found = tuple[Finding, "tuple[str | None, ...]", "float | None"]


class AlertStage(Protocol):
    """What new findings cause, decided before the job that stores them (alerting's
    :class:`~healthsvc.alerting.service.AlertingService`)."""

    def fold(self, run_id: str, attempt: int, found: Sequence[Found],
             write: Callable[[Ops], "Future[FindingsRecorded]"]) -> "Future[FindingsRecorded]":
        """On the recording thread: fold ``found`` (all new) into alerts, then ``write(ops)``
        (the findings job, carrying what the fold wrote) and return its future."""


class FindingsService:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._stage: AlertStage | None = None
        # Recording is serialised: a finding is judged new, folded and submitted under this lock,
        # so two recorders of one run never both take one finding as new.
        self._lock = threading.Lock()
        # run -> the occurrence identities stored (loaded at the run's first record here; a
        # failed write drops it, to be read again).
        self._stored: dict[str, set[str]] = {}

    def set_stage(self, stage: AlertStage | None) -> None:
        """``stage`` folds new findings into what they cause (alerting's: alerts, notifications,
        outbox rows) on the recording thread; its writes commit in the findings' own job."""
        self._stage = stage

    def record(self, run_id: str, attempt: int, findings: list[Finding],
               hosts: dict[int, str] | None = None, fence: Any = None, at: float | None = None) -> Future:
        """Store findings (skipping ones already stored); resolves to the newly stored ones. The
        blamed ranks' hosts are the run's as its state knows them now, unless ``hosts`` names
        them. ``fence`` (replicas): stored only while this replica's lease of the run holds.
        ``at``: when the input that raised them arrived (``StoredFinding.observed_at``; their
        alerts are timed by it).

        On the caller's thread (the run's owner), before the job: which findings are new, their
        hosts, and (the stage) their alerts, notifications and pages. One writer job then stores
        all of it. A job that fails (the store down, the lease gone) stores none of it: the
        caller records them again. Never raises: an error is the future's."""
        try:
            job = self._record(run_id, attempt, findings, hosts, fence, at)
        except Exception as exc:  # noqa: BLE001 - the store cannot be read: recorded again later
            job = Future()
            job.set_exception(exc)
        job.add_done_callback(lambda fut: self.forget(run_id) if fut.exception() is not None else None)
        return job

    def _record(self, run_id: str, attempt: int, findings: list[Finding], hosts: dict[int, str] | None,
                fence: Any, at: float | None) -> Future:
        with self._lock:
            stored = self._stored.get(run_id)
            if stored is None:
                stored = self._stored[run_id] = self.store.findings.identities(run_id)
            new: list[Finding] = []
            keys: set[str] = set()
            for f in findings:
                key = occurrence_key(attempt, f)
                if key not in stored and key not in keys:
                    new.append(f)
                    keys.add(key)
            if not new:
                done: Future = Future()
                done.set_result(FindingsRecorded([]))
                return done
            blamed = [tuple(hosts.get(r) for r in f.ranks) if hosts is not None
                      else self.store.reads.hosts_of(run_id, f.ranks) for f in new]

            def write(ops: Ops | None) -> Future:
                return self.store.findings.submit(run_id, attempt, new, blamed=blamed, ops=ops, fence=fence,
                                                  observed_at=at)
            stage = self._stage
            job = (stage.fold(run_id, attempt, [(f, h, at) for f, h in zip(new, blamed)], write)
                   if stage is not None else write(None))
            stored |= keys
        return job

    def runs_held(self) -> int:
        """Runs whose stored identities are in memory (``healthsvc_runs_held``)."""
        return len(self._stored)

    def forget(self, run_id: str) -> None:
        """Read the run's stored identities again at its next record (a write failed, or the
        run is let go here). Without the lock: a failed job's callback calls it on the writer
        thread, which a recorder holding the lock may be waiting for."""
        self._stored.pop(run_id, None)

    def query(self, run_id: str, *, kind: str | None = None, status: str | None = None,
              since_step: int | None = None, since: float | None = None, min_severity: str | None = None,
              limit: int = 1000, since_id: int | None = None) -> list[StoredFinding]:
        return self.store.findings.query(run_id, kind=kind, status=status, since_step=since_step, since=since,
                                         min_severity=min_severity, limit=limit, since_id=since_id)

    def unresolved(self, run_id: str) -> list[StoredFinding]:
        """Firing findings whose condition (kind, metric, ranks, attempt) no later finding resolved.
        What is *active* also depends on alerting: see :class:`healthsvc.health.RunHealth`."""
        latest: dict[tuple, StoredFinding] = {}
        for sf in self.query(run_id, limit=1_000_000):
            latest[condition_key(sf.attempt, sf.finding)] = sf
        return [sf for sf in latest.values() if sf.finding.status == "firing"]

    def firing_counts(self, run_id: str) -> dict[str, int]:
        """Firing findings ever stored for the run, by kind."""
        return self.store.findings.firing_counts(run_id)
