"""Control writes: a run's config, checkpoints, events, heartbeats and finish.

Each is one job of the store's writer; its result (a :class:`RunEvent`) reaches after-commit
listeners, so the monitor and alerting hear of it once it is durable. The store's
``store.control``: built with the store's writer, the ingest (:class:`IngestRuns`, which owns the
runs' in-memory states) and a clock.
"""
from __future__ import annotations

import sqlite3
from concurrent.futures import Future
from typing import Any, Callable, Protocol

import orjson

from healthsvc.store.results import RunEvent
from healthsvc.store.runstate import RunState
from healthsvc.store.seam import Clock, TableAccess
from healthsvc.store.sharing import DatabaseSharing


class IngestRuns(Protocol):
    """What a control write needs of the ingest, the owner of the runs' in-memory states (both
    on the writer thread, inside a job)."""

    def run_job(self, run_id: str, fn: Callable[[Any], Any]) -> Future:
        """Submit ``fn(conn)``, a write that may create the run (forgotten again if it fails)."""
        ...

    def ensure_run(self, conn: Any, run_id: str, now: float) -> RunState:
        """The run's live state, its row created first if it has none (quotas checked)."""
        ...


class ControlWrites:
    """The writes that are not metrics, the store's ``store.control``. ``sharing``: whether other
    processes write the same runs (:mod:`~healthsvc.store.sharing`: a run's finish is then
    counted in the database)."""

    def __init__(self, db: TableAccess, ingest: IngestRuns, clock: Clock, *, sharing: DatabaseSharing) -> None:
        self._db = db
        self._ingest = ingest
        self._clock = clock
        self._sharing = sharing

    def submit_run_config(self, run_id: str, config: dict) -> Future:
        def job(conn: sqlite3.Connection) -> RunEvent:
            now = self._clock()
            st = self._ingest.ensure_run(conn, run_id, now)
            conn.execute("UPDATE runs SET config=?, updated_at=? WHERE run_id=?", (orjson.dumps(config).decode(), now, run_id))
            return RunEvent(run_id, "config", config, now, st.view())
        return self._ingest.run_job(run_id, job)

    def submit_checkpoint(self, run_id: str, step: int, uri: str, duration_s: float | None,
                          nbytes: int | None) -> Future:
        def job(conn: sqlite3.Connection) -> RunEvent:
            # A checkpoint registered before any metrics belongs to the first attempt, which
            # opens with the first metrics.
            now = self._clock()
            st = self._ingest.ensure_run(conn, run_id, now)
            conn.execute(
                "INSERT INTO checkpoints (run_id, step, uri, attempt, duration_s, bytes, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, step, uri) DO UPDATE SET"
                " duration_s=coalesce(excluded.duration_s, checkpoints.duration_s),"
                " bytes=coalesce(excluded.bytes, checkpoints.bytes)",
                (run_id, step, uri, max(st.attempt, 1), duration_s, nbytes, now))
            (ckpt_id,) = conn.execute("SELECT id FROM checkpoints WHERE run_id=? AND step=? AND uri=?",
                                      (run_id, step, uri)).fetchone()
            return RunEvent(run_id, "checkpoint", {"id": ckpt_id, "step": step, "uri": uri,
                                                   "attempt": max(st.attempt, 1), "duration_s": duration_s,
                                                   "bytes": nbytes}, now, st.view())
        return self._ingest.run_job(run_id, job)

    def submit_checkpoint_status(self, run_id: str, checkpoint_id: int, status: str, note: str | None) -> Future:
        def job(conn: sqlite3.Connection) -> int:
            cur = conn.execute("UPDATE checkpoints SET status=?, note=coalesce(?, note) WHERE run_id=? AND id=?",
                               (status, note, run_id, checkpoint_id))
            return cur.rowcount
        return self._db.write(job)

    def submit_event(self, run_id: str, kind: str, step: int | None, data: dict) -> Future:
        def job(conn: sqlite3.Connection) -> RunEvent:
            now = self._clock()
            st = self._ingest.ensure_run(conn, run_id, now)
            cur = conn.execute("INSERT INTO events (run_id, kind, step, attempt, ts, data) VALUES (?, ?, ?, ?, ?, ?)",
                               (run_id, kind, step, st.attempt, now, orjson.dumps(data).decode()))
            return RunEvent(run_id, "event", {"id": cur.lastrowid, "kind": kind, "step": step,
                                              "attempt": st.attempt, "data": data}, now, st.view())
        return self._ingest.run_job(run_id, job)

    def submit_heartbeat(self, run_id: str, rank: int, step: int | None, phase: str | None) -> Future:
        def job(conn: sqlite3.Connection) -> RunEvent:
            now = self._clock()
            st = self._ingest.ensure_run(conn, run_id, now)
            conn.execute("INSERT OR REPLACE INTO heartbeats VALUES (?, ?, ?, ?, ?)", (run_id, rank, step, phase, now))
            return RunEvent(run_id, "heartbeat", {"rank": rank, "step": step, "phase": phase}, now, st.view())
        return self._ingest.run_job(run_id, job)

    def submit_finish(self, run_id: str, rank: int | None = None) -> Future:
        """The run (``rank=None``) or one rank finished. The run is finished once every rank that
        reported in the current attempt has finished: ranks finish one by one, and records of a
        rank still finishing must not reopen a run another rank has already called finished."""
        def job(conn: sqlite3.Connection) -> RunEvent:
            now = self._clock()
            st = self._ingest.ensure_run(conn, run_id, now)
            if rank is not None:
                if not self._sharing.rank_finished(conn, run_id, st, rank):
                    return RunEvent(run_id, "rank_finished", {"rank": rank}, now, st.view())
            conn.execute("UPDATE runs SET status='finished', finished_at=?, updated_at=? WHERE run_id=?",
                         (now, now, run_id))
            st.finished = True
            return RunEvent(run_id, "finish", {}, now, st.view())
        return self._ingest.run_job(run_id, job)
