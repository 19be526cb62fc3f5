"""The bisections table: one run's persisted bisection over checkpoints (the state machine of
:mod:`detectors.bisection`, stored as its ``to_dict()``), at most one per run; the store's
``store.bisections``.

A probe report is a read-modify-write: :meth:`BisectionsTable.submit_update` runs the
caller's pure update inside one writer job, so two reports never interleave, and stores the
checkpoint verdict it returns in the same job.
"""
from __future__ import annotations

import sqlite3
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from healthsvc.store.seam import Clock, TableAccess

SCHEMA = """
CREATE TABLE IF NOT EXISTS bisections (
    run_id     TEXT PRIMARY KEY,
    state      TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class CheckpointVerdict:
    """What a probe says of one stored checkpoint."""
    checkpoint_id: int
    status: str                   # "verified" | "bad"
    note: str


# state -> (new state, the verdict to store or None); raises to refuse the report.
BisectionUpdate = Callable[[dict[str, Any]], "tuple[dict[str, Any], CheckpointVerdict | None]"]


class NoBisection(LookupError):
    """The run has no bisection."""


class BisectionsTable:
    """The bisections table, the store's ``store.bisections``."""

    def __init__(self, db: TableAccess, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    def state(self, run_id: str) -> dict[str, Any] | None:
        """The run's stored bisection state, or None."""
        row = self._db.read_conn().execute("SELECT state FROM bisections WHERE run_id=?", (run_id,)).fetchone()
        return None if row is None else orjson.loads(row[0])

    def exists(self, run_id: str) -> bool:
        return self._db.read_conn().execute(
            "SELECT 1 FROM bisections WHERE run_id=?", (run_id,)).fetchone() is not None

    def submit(self, run_id: str, state: dict[str, Any]) -> Future:
        """Start (or replace) the run's bisection."""
        def job(conn: sqlite3.Connection) -> None:
            now = self._clock()
            conn.execute("INSERT OR REPLACE INTO bisections (run_id, state, created_at, updated_at)"
                         " VALUES (?, ?, ?, ?)", (run_id, orjson.dumps(state).decode(), now, now))
        return self._db.write(job)

    def submit_update(self, run_id: str, update: BisectionUpdate) -> Future:
        """Apply ``update`` to the stored state atomically; resolves to the new state, or raises
        :class:`NoBisection` (or what ``update`` raised)."""
        def job(conn: sqlite3.Connection) -> dict[str, Any]:
            row = conn.execute("SELECT state FROM bisections WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                raise NoBisection(run_id)
            state, verdict = update(orjson.loads(row[0]))
            conn.execute("UPDATE bisections SET state=?, updated_at=? WHERE run_id=?",
                         (orjson.dumps(state).decode(), self._clock(), run_id))
            if verdict is not None:
                conn.execute("UPDATE checkpoints SET status=?, note=? WHERE run_id=? AND id=?",
                             (verdict.status, verdict.note, run_id, verdict.checkpoint_id))
            return state
        return self._db.write(job)

    def submit_delete(self, run_id: str) -> Future:
        """Abandon the run's bisection; resolves to whether there was one."""
        return self._db.write(lambda conn: conn.execute(
            "DELETE FROM bisections WHERE run_id=?", (run_id,)).rowcount > 0)
