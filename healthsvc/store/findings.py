"""The findings table: what the detectors found, per run, with the hosts they blame.

A finding's occurrence identity (:func:`healthsvc.identity.occurrence_key`) is unique per run, so
a replay after a restart never stores a finding twice: :meth:`FindingsTable.submit` (the store's
``store.findings.submit``) resolves to the findings it newly stored (a :class:`FindingsRecorded`, which the store's
after-commit listeners also receive).
"""
from __future__ import annotations

import logging
import sqlite3
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import orjson

from healthsvc_detectors.finding import SEVERITY_ORDER, Finding
from healthsvc.encode import jsonable
from healthsvc.identity import occurrence_key
from healthsvc.store.fencing import Fence
from healthsvc.store.ops import Ops, apply_ops
from healthsvc.store.seam import Clock, TableAccess

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
    # When the input that raised it reached the service (a push's or an event's receipt), if
    # its recorder said: earlier than created_at when the run's owner judged the data late (a
    # takeover's or a restart's replay). Alerts are timed by it.
    observed_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = self.finding.to_dict()
        d.update(id=self.id, run_id=self.run_id, attempt=self.attempt, hosts=list(self.hosts),
                 created_at=self.created_at, observed_at=self.observed_at)
        return d


@dataclass
class FindingsRecorded:
    """The result of a findings job; the store's after-commit hook hands it to listeners."""
    findings: list[StoredFinding]


class AlreadyStored(Exception):
    """A findings job with writes decided from them found one of them stored already: its
    recorder believed it new, so what it decided is not written either (the job is rolled back
    whole; the recorder reads the store back and records again)."""

# (run_id, ranks) -> each rank's host as the run's ingest state knows it (None where unknown);
# called on the writer thread, which owns that state.
HostsOf = Callable[[str, Sequence[int]], "tuple[str | None, ...]"]


class FindingsTable:
    """The findings table, the store's ``store.findings``."""

    def __init__(self, db: TableAccess, clock: Clock, hosts_of: HostsOf) -> None:
        self._db = db
        self._clock = clock
        self._hosts_of = hosts_of

    def submit(self, run_id: str, attempt: int, findings: list[Finding],
               hosts: dict[int, str] | None = None, *, blamed: Sequence[tuple[str | None, ...]] | None = None,
               ops: Ops | None = None, fence: Fence | None = None, observed_at: float | None = None) -> Future:
        """Store findings, skipping ones already stored; resolves to a :class:`FindingsRecorded`.

        The blamed ranks' hosts: ``blamed`` (one tuple per finding, as its recorder named them),
        else ``hosts`` (rank -> host: tools and tests that record findings for ranks the store
        never saw), else the run's, as its :class:`~healthsvc.store.runstate.RunState` knows them
        when the job runs (on the writer thread, which owns that state).

        ``ops``: what folding these findings into alerts wrote (alert records, notifications,
        outbox rows: plain data, ``Outbox.collect``), applied in the same job, so a crash never
        leaves a finding without its alert and its page. They were decided with every finding
        taken as new: if one is stored already the job fails whole (:class:`AlreadyStored`).

        ``fence`` (replicas): stored only while this replica's lease of the run holds (see the
        store's ``write``). ``observed_at``: when the input that raised them arrived
        (:attr:`StoredFinding.observed_at`; None: not known)."""
        def job(conn: sqlite3.Connection) -> FindingsRecorded:
            now = self._clock()
            stored = []
            for i, f in enumerate(findings):
                # What listeners see is what is stored: evidence with NaN as "NaN", never null.
                f = replace(f, evidence=jsonable(f.evidence))
                if blamed is not None:
                    blamed_hosts = tuple(blamed[i])
                elif hosts is not None:
                    blamed_hosts = tuple(hosts.get(r) for r in f.ranks)
                else:
                    blamed_hosts = self._hosts_of(run_id, f.ranks)
                cur = conn.execute(
                    "INSERT OR IGNORE INTO findings (run_id, attempt, kind, metric, ranks, hosts, step, status, severity,"
                    " score, onset_step, evidence, created_at, identity, observed_at)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, attempt, f.kind, f.metric, orjson.dumps(list(f.ranks)).decode(), orjson.dumps(blamed_hosts).decode(),
                     int(f.step), f.status, f.severity, float(f.score), f.onset_step,
                     orjson.dumps(f.evidence).decode(), now, occurrence_key(attempt, f), observed_at))
                if cur.rowcount:
                    assert cur.lastrowid is not None   # the row just inserted
                    stored.append(StoredFinding(cur.lastrowid, run_id, attempt, blamed_hosts, now, f, observed_at))
                elif ops is not None:
                    raise AlreadyStored(f"run {run_id}: a {f.kind} finding at step {f.step} is stored already")
            if ops is not None:
                apply_ops(conn, ops)
            return FindingsRecorded(stored)
        return self._db.write(job, fence)

    def query(self, run_id: str, *, kind: str | None = None, status: str | None = None,
                 since_step: int | None = None, since: float | None = None, min_severity: str | None = None,
                 limit: int = 1000, since_id: int | None = None,
                 conn: sqlite3.Connection | None = None) -> list[StoredFinding]:
        """A run's stored findings, oldest first, filtered by every argument that is set (read
        through ``conn``, a job's connection, to see what the job wrote)."""
        sql = ("SELECT id, attempt, kind, metric, ranks, hosts, step, status, severity, score, onset_step, evidence,"
               " created_at, observed_at FROM findings WHERE run_id=?")
        args: list[Any] = [run_id]
        for column, op, value in (("kind", "=", kind), ("status", "=", status), ("step", ">=", since_step),
                                  ("created_at", ">=", since), ("id", ">", since_id)):
            if value is not None:
                sql += f" AND {column}{op}?"
                args.append(value)
        sql += " ORDER BY id LIMIT ?"
        args.append(limit)
        out = []
        for (fid, attempt, k, metric, ranks, hosts, step, st, sev, score, onset, evidence, created, observed) in \
                (conn or self._db.read_conn()).execute(sql, args):
            if min_severity is not None and SEVERITY_ORDER[sev] < SEVERITY_ORDER[min_severity]:
                continue
            f = Finding(kind=k, step=step, ranks=tuple(orjson.loads(ranks)), severity=sev, score=score,
                        metric=metric, status=st, onset_step=onset, evidence=orjson.loads(evidence))
            out.append(StoredFinding(fid, run_id, attempt, tuple(orjson.loads(hosts)), created, f, observed))
        return out

    def identities(self, run_id: str) -> set[str]:
        """The occurrence identities of the run's stored findings (a recorder skips these)."""
        return {k for (k,) in self._db.read_conn().execute("SELECT identity FROM findings WHERE run_id=?", (run_id,))}

    def firing_counts(self, run_id: str) -> dict[str, int]:
        """Firing findings ever stored for the run, by kind."""
        return dict(self._db.read_conn().execute(
            "SELECT kind, count(*) FROM findings WHERE run_id=? AND status='firing' GROUP BY kind", (run_id,)))
