"""The probes table: replay probes of suspect ranks (see :mod:`healthsvc.probes`); the store's
``store.probes``.

A probe is who is suspected, whom to compare it with, which step's batch to replay, and the
reports so far (rank -> gradient norm, JSON; non-finite values as their strings). A report is a
read-modify-write: :meth:`ProbesTable.submit_report` runs the caller's pure decision inside
one writer job, so two reports never interleave.
"""
from __future__ import annotations

import sqlite3
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from healthsvc.store.seam import TableAccess

SCHEMA = """
CREATE TABLE IF NOT EXISTS probes (
    id           INTEGER PRIMARY KEY,
    run_id       TEXT NOT NULL,
    suspect_rank INTEGER NOT NULL,
    healthy_rank INTEGER NOT NULL,
    step         INTEGER NOT NULL,
    finding_id   INTEGER,
    reason       TEXT,
    created_at   REAL NOT NULL,
    reports      TEXT NOT NULL DEFAULT '{}',
    verdict      TEXT
);
CREATE INDEX IF NOT EXISTS probes_by_run ON probes (run_id, id);
"""
_COLUMNS = "id, run_id, suspect_rank, healthy_rank, step, finding_id, reason, created_at, reports, verdict"


@dataclass(frozen=True)
class ProbeRow:
    id: int
    run_id: str
    suspect_rank: int
    healthy_rank: int
    step: int
    finding_id: int | None
    reason: str | None
    created_at: float
    reports: dict[str, Any]       # str(rank) -> gradient norm (a float, or "NaN"/"Infinity"/...)
    verdict: str | None

    @classmethod
    def from_row(cls, row: tuple) -> "ProbeRow":
        pid, run_id, suspect, healthy, step, finding_id, reason, created_at, reports, verdict = row
        return cls(pid, run_id, suspect, healthy, step, finding_id, reason, created_at,
                   reports=orjson.loads(reports), verdict=verdict)


# The stored probe -> (its new reports, its verdict or None), or None to leave it as it is (a
# retried report); raises to refuse the report.
ProbeReport = Callable[[ProbeRow], "tuple[dict[str, Any], str | None] | None"]


class NoProbe(LookupError):
    """The run has no such probe."""


class ProbesTable:
    """The probes table, the store's ``store.probes``."""

    def __init__(self, db: TableAccess) -> None:
        self._db = db

    def submit(self, run_id: str, suspect: int, healthy: int, step: int,
               finding_id: int | None, reason: str | None, now: float, *,
               unless_pending: bool = False) -> Future:
        """Store a probe request; resolves to its id, or None when ``unless_pending`` and the
        suspect already has a probe waiting for its verdict."""
        def job(conn: sqlite3.Connection) -> int | None:
            if unless_pending and conn.execute(
                    "SELECT 1 FROM probes WHERE run_id=? AND suspect_rank=? AND verdict IS NULL",
                    (run_id, suspect)).fetchone() is not None:
                return None
            cur = conn.execute(
                "INSERT INTO probes (run_id, suspect_rank, healthy_rank, step, finding_id, reason,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, suspect, healthy, step, finding_id, reason, now))
            assert cur.lastrowid is not None   # an INSERT's row id
            return int(cur.lastrowid)
        return self._db.write(job)

    def get(self, run_id: str, probe_id: int) -> ProbeRow | None:
        row = self._db.read_conn().execute(
            f"SELECT {_COLUMNS} FROM probes WHERE run_id=? AND id=?", (run_id, probe_id)).fetchone()
        return None if row is None else ProbeRow.from_row(row)

    def of_run(self, run_id: str) -> list[ProbeRow]:
        """The run's probes, oldest first."""
        rows = self._db.read_conn().execute(
            f"SELECT {_COLUMNS} FROM probes WHERE run_id=? ORDER BY id", (run_id,)).fetchall()
        return [ProbeRow.from_row(r) for r in rows]

    def next_pending(self, run_id: str, after: int, upto_step: int) -> ProbeRow | None:
        """The oldest probe still waiting for its verdict with an id above ``after`` and a step
        at or before ``upto_step``."""
        row = self._db.read_conn().execute(
            f"SELECT {_COLUMNS} FROM probes WHERE run_id=? AND id>? AND verdict IS NULL AND step<=?"
            " ORDER BY id LIMIT 1", (run_id, after, upto_step)).fetchone()
        return None if row is None else ProbeRow.from_row(row)

    def submit_report(self, run_id: str, probe_id: int, decide: ProbeReport) -> Future:
        """Apply ``decide`` to the stored probe atomically; raises :class:`NoProbe` (or what
        ``decide`` raised)."""
        def job(conn: sqlite3.Connection) -> None:
            row = conn.execute(f"SELECT {_COLUMNS} FROM probes WHERE run_id=? AND id=?",
                               (run_id, probe_id)).fetchone()
            if row is None:
                raise NoProbe(probe_id)
            change = decide(ProbeRow.from_row(row))
            if change is not None:
                reports, verdict = change
                conn.execute("UPDATE probes SET reports=?, verdict=? WHERE run_id=? AND id=?",
                             (orjson.dumps(reports).decode(), verdict, run_id, probe_id))
        return self._db.write(job)
