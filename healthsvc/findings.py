"""Stored findings: what the detectors found, per run, with the hosts they blame.

A finding's identity (attempt, kind, metric, ranks, step, status) is unique per run, so replaying
input after a restart never stores or announces a finding twice. Listeners (alerting) hear about
each newly stored finding once, after it is committed.
"""
from __future__ import annotations

import logging
import sqlite3
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Callable

import orjson

from detectors.finding import SEVERITY_ORDER, Finding
from healthsvc.encode import jsonable
from healthsvc.identity import occurrence_key
from healthsvc.store.sqlite import SQLiteStore

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS findings (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    metric     TEXT,
    ranks      TEXT NOT NULL,
    hosts      TEXT NOT NULL,
    step       INTEGER NOT NULL,
    status     TEXT NOT NULL,
    severity   TEXT NOT NULL,
    score      REAL NOT NULL,
    onset_step INTEGER,
    evidence   TEXT NOT NULL,
    created_at REAL NOT NULL,
    identity   TEXT NOT NULL,
    UNIQUE (run_id, identity)
);
CREATE INDEX IF NOT EXISTS findings_by_run ON findings (run_id, id);
"""


@dataclass(frozen=True)
class StoredFinding:
    id: int
    run_id: str
    attempt: int
    hosts: tuple[str | None, ...]   # one per blamed rank, None where unknown
    created_at: float               # when the service stored it, unix seconds
    finding: Finding

    def to_dict(self) -> dict[str, Any]:
        d = self.finding.to_dict()
        d.update(id=self.id, run_id=self.run_id, attempt=self.attempt, hosts=list(self.hosts),
                 created_at=self.created_at)
        return d


@dataclass
class FindingsRecorded:
    """The result of a record job; the store's after-commit hook hands it to listeners."""
    findings: list[StoredFinding]


class FindingsService:
    def __init__(self, store: SQLiteStore, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._listeners: list[Callable[[list[StoredFinding]], None]] = []
        store.register_schema(SCHEMA)
        store.subscribe(self._after_commit)

    def subscribe(self, listener: Callable[[list[StoredFinding]], None]) -> None:
        """``listener(findings)`` runs on the writer thread after commit; keep it quick (enqueue)."""
        self._listeners.append(listener)

    def _after_commit(self, results: list[Any]) -> None:
        for res in results:
            if isinstance(res, FindingsRecorded) and res.findings:
                for listener in self._listeners:
                    try:
                        listener(res.findings)
                    except Exception:
                        log.exception("findings listener failed")

    def record(self, run_id: str, attempt: int, findings: list[Finding], hosts: dict[int, str]) -> Future:
        """Store findings (skipping ones already stored); resolves to the newly stored ones."""
        def job(conn: sqlite3.Connection) -> FindingsRecorded:
            now = self.clock()
            stored = []
            for f in findings:
                # What listeners see is what is stored: evidence with NaN as "NaN", never null.
                f = replace(f, evidence=jsonable(f.evidence))
                blamed_hosts = tuple(hosts.get(r) for r in f.ranks)
                cur = conn.execute(
                    "INSERT OR IGNORE INTO findings (run_id, attempt, kind, metric, ranks, hosts, step, status, severity,"
                    " score, onset_step, evidence, created_at, identity) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, attempt, f.kind, f.metric, orjson.dumps(list(f.ranks)), orjson.dumps(blamed_hosts),
                     int(f.step), f.status, f.severity, float(f.score), f.onset_step,
                     orjson.dumps(f.evidence),
                     now, occurrence_key(attempt, f)))
                if cur.rowcount:
                    stored.append(StoredFinding(cur.lastrowid, run_id, attempt, blamed_hosts, now, f))
            return FindingsRecorded(stored)
        return self.store.write(job)

    def query(self, run_id: str, *, kind: str | None = None, status: str | None = None,
              since_step: int | None = None, since: float | None = None, min_severity: str | None = None,
              limit: int = 1000, since_id: int | None = None) -> list[StoredFinding]:
        sql = ("SELECT id, attempt, kind, metric, ranks, hosts, step, status, severity, score, onset_step, evidence,"
               " created_at FROM findings WHERE run_id=?")
        args: list[Any] = [run_id]
        if kind is not None:
            sql += " AND kind=?"
            args.append(kind)
        if status is not None:
            sql += " AND status=?"
            args.append(status)
        if since_step is not None:
            sql += " AND step>=?"
            args.append(since_step)
        if since is not None:
            sql += " AND created_at>=?"
            args.append(since)
        if since_id is not None:
            sql += " AND id>?"
            args.append(since_id)
        sql += " ORDER BY id LIMIT ?"
        args.append(limit)
        out = []
        for (fid, attempt, k, metric, ranks, hosts, step, st, sev, score, onset, evidence, created) in \
                self.store.read_conn().execute(sql, args):
            if min_severity is not None and SEVERITY_ORDER[sev] < SEVERITY_ORDER[min_severity]:
                continue
            f = Finding(kind=k, step=step, ranks=tuple(orjson.loads(ranks)), severity=sev, score=score,
                        metric=metric, status=st, onset_step=onset, evidence=orjson.loads(evidence))
            out.append(StoredFinding(fid, run_id, attempt, tuple(orjson.loads(hosts)), created, f))
        return out

    def stored_after(self, after_id: int, limit: int = 10_000) -> list[StoredFinding]:
        """Findings of every run stored after ``after_id``, oldest first (alerting replays these
        at start: the ones it had not processed when the service stopped)."""
        runs = [r for (r,) in self.store.read_conn().execute(
            "SELECT DISTINCT run_id FROM findings WHERE id > ?", (after_id,))]
        out = [sf for run_id in runs for sf in self.query(run_id, since_id=after_id, limit=limit)]
        return sorted(out, key=lambda sf: sf.id)[:limit]

    def newest_id(self) -> int:
        """The id of the newest stored finding (0: none)."""
        return self.store.read_conn().execute("SELECT coalesce(max(id), 0) FROM findings").fetchone()[0]

    def unresolved(self, run_id: str) -> list[StoredFinding]:
        """Firing findings whose condition (kind, metric, ranks, attempt) no later finding resolved.
        What is *active* also depends on alerting: see :class:`healthsvc.health.RunHealth`."""
        latest: dict[tuple, StoredFinding] = {}
        for sf in self.query(run_id, limit=1_000_000):
            f = sf.finding
            latest[(sf.attempt, f.kind, f.metric, f.ranks)] = sf
        return [sf for sf in latest.values() if sf.finding.status == "firing"]

    def firing_counts(self, run_id: str) -> dict[str, int]:
        """Firing findings ever stored for the run, by kind."""
        return dict(self.store.read_conn().execute(
            "SELECT kind, count(*) FROM findings WHERE run_id=? AND status='firing' GROUP BY kind", (run_id,)))
