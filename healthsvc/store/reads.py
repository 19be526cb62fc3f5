"""Reads of the service store: runs, attempts, hosts, checkpoints, events, heartbeats and the
stored metrics (the effective history: for each step, the newest attempt that reached it).

Every read uses the calling thread's own connection (WAL: readers never block the writer). The
store's ``store.reads``, built with the store's reader (:class:`~healthsvc.store.seam.TableAccess`)
and the ingest, whose runs' in-memory states it reads through :class:`RunStates`.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Protocol, Sequence

import numpy as np
import orjson

from healthsvc.store.batch import MetricBatch
from healthsvc.store.codec import decode_chunk
from healthsvc.store.runstate import RunSnapshot, RunState
from healthsvc.store.seam import TableAccess


class RunStates(Protocol):
    """What the reads need of the ingest, the owner of the runs' in-memory states."""

    def state(self, run_id: str) -> RunState | None:
        """The run's live state, or None when it is not in memory (the writer thread's)."""
        ...

    def held(self) -> int:
        """Runs whose state is in memory."""
        ...

    def states(self) -> Iterable[RunState]:
        """The states in memory."""
        ...

    def built_run_state(self, conn: Any, run_id: str, status: str) -> RunState:
        """A run's state as the database has it, built on ``conn`` and not kept."""
        ...


class StoreReads:
    """Everything that only reads, the store's ``store.reads``."""

    def __init__(self, db: TableAccess, runs: RunStates) -> None:
        self._db = db
        self._runs = runs

    def run_state(self, run_id: str) -> RunState | None:
        """The live state: the writer thread's alone (it changes it on every push). Every other
        thread reads :meth:`run_view`."""
        return self._runs.state(run_id)

    def runs_held(self) -> int:
        """Runs whose ingest state is in memory (``/metrics``)."""
        return self._runs.held()

    def run_view(self, run_id: str) -> RunSnapshot | None:
        """The run's state as of now, copied: for any thread (API handlers, the monitor, the
        dashboard, scrapes); None for a run that has no state (never pushed to)."""
        st = self._runs.state(run_id) or self._released_state(run_id)
        return None if st is None else st.snapshot()

    def hosts_of(self, run_id: str, ranks: Sequence[int]) -> tuple[str | None, ...]:
        """Each rank's host as the run's state knows it (None where unknown), for any thread:
        the run's owner names the hosts of its findings' alerts before their job."""
        st = self._runs.state(run_id) or self._released_state(run_id)
        return st.hosts_for_reader(ranks) if st is not None else (None,) * len(ranks)

    def ranks_not_past(self, run_id: str, step: int) -> tuple[int, ...] | None:
        """The ranks seen in the run's current attempt that have not stored a record beyond
        ``step`` (ascending), for any thread; None for a run that has no state (never pushed
        to). What the supervisor's settle stage waits on (``healthsvc.supervise.service``)."""
        st = self._runs.state(run_id) or self._released_state(run_id)
        return None if st is None else st.ranks_not_past(step)

    def _released_state(self, run_id: str) -> RunState | None:
        """The state of a run let go from memory (``release_run_states``: it has an ingest
        snapshot), rebuilt from the database on this thread's connection and not kept; None
        for a run never pushed to."""
        row = self._db.read_conn().execute(
            "SELECT status FROM runs WHERE run_id=? AND EXISTS (SELECT 1 FROM run_state WHERE run_id=? AND kind='ingest')",
            (run_id, run_id)).fetchone()
        return None if row is None else self._runs.built_run_state(self._db.read_conn(), run_id, row[0])

    def newest_time(self) -> float:
        """The newest service-clock time the store holds of the runs' activity (pushes,
        heartbeats, run changes), unix seconds; 0 for an empty store. Read at start, so a service
        clock that came back behind it can start from it (``healthsvc.clock``)."""
        pushes = max((st.last_push or 0.0 for st in self._runs.states()), default=0.0)
        (beats, runs) = self._db.read_conn().execute(
            "SELECT (SELECT max(ts) FROM heartbeats), (SELECT max(updated_at) FROM runs)").fetchone()
        return max(pushes, beats or 0.0, runs or 0.0)

    def run_exists(self, run_id: str) -> bool:
        return self._db.read_conn().execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is not None

    def list_run_rows(self) -> list[dict]:
        rows = self._db.read_conn().execute(
            "SELECT run_id, created_at, updated_at, config, status, finished_at FROM runs ORDER BY created_at")
        return [self._run_row(r) for r in rows]

    def get_run_row(self, run_id: str) -> dict | None:
        r = self._db.read_conn().execute(
            "SELECT run_id, created_at, updated_at, config, status, finished_at FROM runs WHERE run_id=?",
            (run_id,)).fetchone()
        return None if r is None else self._run_row(r)

    @staticmethod
    def _run_row(r: tuple) -> dict:
        return {"run_id": r[0], "created_at": r[1], "updated_at": r[2], "config": orjson.loads(r[3]),
                "status": r[4], "finished_at": r[5]}

    def attempts(self, run_id: str) -> list[dict]:
        st = self._runs.state(run_id) or self._released_state(run_id)
        progress = dict(st.attempt_progress) if st else {}
        rows = self._db.read_conn().execute(
            "SELECT attempt, start_step, opened_at FROM attempts WHERE run_id=? ORDER BY attempt", (run_id,))
        out = []
        for a, s, t in rows:
            last_step, n = progress.get(a, (s, 0))
            out.append({"attempt": a, "start_step": s, "last_step": last_step, "n_records": n, "opened_at": t})
        return out

    def hosts(self, run_id: str) -> dict[int, str]:
        return dict(self._db.read_conn().execute("SELECT rank, host FROM hosts WHERE run_id=?", (run_id,)))

    def checkpoints(self, run_id: str) -> list[dict]:
        rows = self._db.read_conn().execute(
            "SELECT id, step, uri, attempt, duration_s, bytes, created_at, status, note FROM checkpoints"
            " WHERE run_id=? ORDER BY step, id", (run_id,))
        keys = ("id", "step", "uri", "attempt", "duration_s", "bytes", "created_at", "status", "note")
        return [dict(zip(keys, r)) for r in rows]

    def events(self, run_id: str) -> list[dict]:
        rows = self._db.read_conn().execute(
            "SELECT id, kind, step, attempt, ts, data FROM events WHERE run_id=? ORDER BY id", (run_id,))
        return [{"id": i, "kind": k, "step": s, "attempt": a, "ts": t, "data": orjson.loads(d)}
                for i, k, s, a, t, d in rows]

    def heartbeats(self, run_id: str) -> list[dict]:
        rows = self._db.read_conn().execute(
            "SELECT rank, step, phase, ts FROM heartbeats WHERE run_id=? ORDER BY rank", (run_id,))
        return [{"rank": r, "step": s, "phase": p, "ts": t} for r, s, p, t in rows]

    def attempt_spans(self, *, exclude_run_id: str | None = None) -> list[tuple[str, int, float, float]]:
        """``(run_id, attempt, first push, last push)`` of every attempt with metrics (service
        clock, unix seconds), of every run but ``exclude_run_id``."""
        return self._db.read_conn().execute(
            "SELECT run_id, attempt, min(received_at), max(received_at) FROM chunks WHERE run_id IS NOT ?"
            " GROUP BY run_id, attempt", (exclude_run_id,)).fetchall()

    def fields(self, run_id: str) -> tuple[list[str], bool]:
        """Metric fields ever reported by the run (in first-seen order), and whether hosts were."""
        names: list[str] = []
        has_hosts = False
        for fields, hosts in self._db.read_conn().execute(
                "SELECT fields, max(has_hosts) FROM chunks WHERE run_id=? GROUP BY fields ORDER BY min(id)", (run_id,)):
            names.extend(f for f in fields.split(",") if f and f not in names)
            has_hosts = has_hosts or bool(hosts)
        return names, has_hosts

    def iter_chunks(self, run_id: str, *, step_min: int | None = None, step_max: int | None = None,
                    attempt: int | None = None, fields: set[str] | None = None,
                    effective: bool = True) -> Iterator[tuple[int, MetricBatch]]:
        """Yield ``(attempt, batch)`` per stored chunk, filtered to the step range.

        With ``effective`` (and no explicit attempt), records superseded by a newer attempt are
        dropped: for each step the newest attempt that reached it wins.
        """
        conn = self._db.read_conn()
        starts = {a["attempt"]: a["start_step"] for a in self.attempts(run_id)}
        # Upper bound (exclusive) of the steps each attempt still owns in the effective history.
        bound: dict[int, float] = {}
        limit = float("inf")
        for a in sorted(starts, reverse=True):
            bound[a] = limit
            limit = min(limit, starts[a])
        sql = "SELECT attempt, payload FROM chunks WHERE run_id=?"
        args: list[Any] = [run_id]
        if step_min is not None:
            sql += " AND step_max >= ?"
            args.append(step_min)
        if step_max is not None:
            sql += " AND step_min <= ?"
            args.append(step_max)
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        sql += " ORDER BY id"
        for chunk_attempt, payload in conn.execute(sql, args):
            if attempt is None and effective and bound.get(chunk_attempt, float("inf")) <= starts.get(chunk_attempt, 0):
                continue  # an attempt wholly superseded
            batch = decode_chunk(payload, fields)
            keep = np.ones(len(batch), dtype=bool)
            if step_min is not None:
                keep &= batch.steps >= step_min
            if step_max is not None:
                keep &= batch.steps <= step_max
            if attempt is None and effective and bound.get(chunk_attempt, float("inf")) != float("inf"):
                keep &= batch.steps < bound[chunk_attempt]
            if not keep.all():
                batch = batch.take(keep)
            if len(batch):
                yield chunk_attempt, batch
