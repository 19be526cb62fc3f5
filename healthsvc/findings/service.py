"""Stored findings as the service uses them: recorded by the monitor, queried by the API, run
health, rollback and economics; folded into alerts by the stage alerting sets, in the job that
stores them.

The table and its SQL are the store's (:mod:`healthsvc.store.findings`); a finding's identity is
:mod:`healthsvc.identity`'s, so a replay after a restart never stores or announces one twice.
"""
from __future__ import annotations

import functools
import logging
from concurrent.futures import Future
from typing import Any, Callable, Protocol

from healthsvc_detectors.finding import Finding
from healthsvc.identity import condition_key
from healthsvc.store.findings import FindingsRecorded, FindingsStage, StoredFinding
from healthsvc.store.interface import Store

__all__ = ["AlertStage", "FindingsRecorded", "FindingsService", "StoredFinding"]

log = logging.getLogger(__name__)


class AlertStage(Protocol):
    """What new findings cause, decided with them (alerting's
    :class:`~healthsvc.alerting.service.AlertingService`)."""

    def prepare(self, run_id: str, attempt: int, findings: list[Finding]) -> Any:
        """On the recording thread, before the job: what the job needs that the writer thread
        must not spend its time on (a corruption page's rollback target)."""

    def in_job(self, conn: Any, stored: list[StoredFinding], prepared: Any = None) -> list[Callable[[], None]]:
        """In the job that stores the findings: returns what to run once it is durable."""


class FindingsService:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._stage: AlertStage | None = None

    def set_stage(self, stage: AlertStage | None) -> None:
        """``stage`` folds findings into what they cause, in the job that stores them (alerting's:
        the alerts, notifications and outbox rows commit with the findings). Its ``prepare``
        runs first on the recording thread (the run's owner), its ``in_job`` on the writer."""
        self._stage = stage

    def committed(self, results: list[Any]) -> None:
        """A group commit's results (the pipeline's stage, on the writer thread): run what each
        findings job's stage asked for once it is durable (hand its pages to delivery)."""
        for res in results:
            if isinstance(res, FindingsRecorded):
                for callback in res.after_commit:
                    try:
                        callback()
                    except Exception:
                        log.exception("findings after-commit callback failed")

    def record(self, run_id: str, attempt: int, findings: list[Finding],
               hosts: dict[int, str] | None = None, fence: Any = None, at: float | None = None) -> Future:
        """Store findings (skipping ones already stored); resolves to the newly stored ones. The
        blamed ranks' hosts are the store's (the run's state), unless ``hosts`` names them.
        ``fence`` (replicas): stored only while this replica's lease of the run holds. ``at``:
        when the input that raised them arrived (``StoredFinding.observed_at``; their alerts
        are timed by it)."""
        then: FindingsStage | None = None
        stage = self._stage
        if stage is not None:
            prepared = stage.prepare(run_id, attempt, findings)
            then = functools.partial(stage.in_job, prepared=prepared)
        return self.store.findings.submit(run_id, attempt, findings, hosts, then=then, fence=fence, observed_at=at)

    def query(self, run_id: str, *, kind: str | None = None, status: str | None = None,
              since_step: int | None = None, since: float | None = None, min_severity: str | None = None,
              limit: int = 1000, since_id: int | None = None) -> list[StoredFinding]:
        return self.store.findings.query(run_id, kind=kind, status=status, since_step=since_step, since=since,
                                         min_severity=min_severity, limit=limit, since_id=since_id)

    def stored_after(self, after_id: int, limit: int = 10_000, conn: Any = None) -> list[StoredFinding]:
        """Findings of every run stored after ``after_id``, oldest first (alerting processes
        these: in the findings job, through its ``conn``, and at start)."""
        out = [sf for run_id in self.store.findings.runs_after(after_id, conn=conn)
               for sf in self.store.findings.query(run_id, since_id=after_id, limit=limit, conn=conn)]
        return sorted(out, key=lambda sf: sf.id)[:limit]

    def newest_id(self) -> int:
        """The id of the newest stored finding (0: none)."""
        return self.store.findings.newest_id()

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
