"""The embedded store: one SQLite file in WAL mode, one writer thread, many readers.

Metrics are stored as one compressed columnar chunk per accepted batch (see ``codec``), never one
row per rank. Writes go through :class:`GroupCommitWriter`; reads use a connection per thread.
``synchronous=FULL`` makes a commit durable before the request that caused it is answered.

Other modules (findings, alerting, rollback) keep their SQL next to their logic and run their
writes through :meth:`SQLiteStore.write` and their reads through :meth:`SQLiteStore.read_conn`.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import orjson

from healthsvc.ingest.batch import MetricBatch
from healthsvc.store.codec import decode_chunk, encode_chunk
from healthsvc.store.runstate import RunState
from healthsvc.store.schema import SCHEMA
from healthsvc.store.writer import GroupCommitWriter

log = logging.getLogger(__name__)


@dataclass
class IngestResult:
    """What one accepted metrics batch did; also handed to after-commit listeners."""
    run_id: str
    accepted: int
    duplicate: bool
    attempt: int
    new_attempt: bool
    chunk_id: int | None
    received_at: float
    batch: MetricBatch | None = None


@dataclass
class RunEvent:
    """A non-metrics write that listeners (the run monitor) care about."""
    run_id: str
    kind: str                      # "heartbeat" | "finish" | "config" | "event" | "checkpoint"
    data: dict
    received_at: float


def sqlite_path_from_uri(uri: str) -> str:
    """``sqlite:///rel/path.db``, ``sqlite:////abs/path.db`` or a plain path."""
    if uri.startswith("sqlite:///"):
        return uri[len("sqlite:///"):]
    if uri.startswith("sqlite://"):
        raise ValueError(f"bad SQLite URI {uri!r}: use sqlite:///relative.db or sqlite:////absolute.db")
    if "://" in uri:
        raise ValueError(f"unsupported store URI {uri!r}: this build supports sqlite:///PATH")
    return uri


class SQLiteStore:
    def __init__(self, uri: str, *, snapshot_every_s: float = 5.0, dedupe_window_s: float = 3600.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = sqlite_path_from_uri(uri)
        self.snapshot_every_s = snapshot_every_s
        # How long a batch's idempotency key is remembered: retries come within minutes, and one
        # row per request kept forever would outgrow the data itself at thousands of ranks.
        self.dedupe_window_s = dedupe_window_s
        self._last_prune = 0.0
        self._clock = clock
        self._runs: dict[str, RunState] = {}
        self._last_snapshot: dict[str, float] = {}
        self._listeners: list[Callable[[list[Any]], None]] = []
        self._local = threading.local()
        self._writer: GroupCommitWriter | None = None
        self._write_conn: sqlite3.Connection | None = None
        self._schemas: list[str] = [SCHEMA]

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    # -- lifecycle ------------------------------------------------------------------------
    def open(self) -> None:
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        conn = self._connect()
        for script in self._schemas:
            conn.executescript(script)
        self._write_conn = conn
        self._load_run_states(conn)
        self._writer = GroupCommitWriter(conn, after_commit=self._notify, after_rollback=self._reload_run_states)
        self._writer.start()

    def close(self) -> None:
        if self._writer is None:
            return
        fut = self._writer.submit(self._snapshot_all)
        try:
            fut.result(timeout=10)
        except Exception:
            log.exception("final snapshot failed")
        self._writer.stop()
        self._writer = None
        if self._write_conn is not None:
            self._write_conn.close()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def register_schema(self, script: str) -> None:
        """Idempotent DDL (CREATE ... IF NOT EXISTS) of a feature's tables; call before open()."""
        if self._writer is not None:
            raise RuntimeError("register_schema() must be called before the store opens")
        self._schemas.append(script)

    def read_conn(self) -> sqlite3.Connection:
        """A connection owned by the calling thread, for reads."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=ON")
            self._local.conn = conn
        return conn

    def subscribe(self, listener: Callable[[list[Any]], None]) -> None:
        """``listener(results)`` runs on the writer thread after each commit; keep it quick."""
        self._listeners.append(listener)

    def _notify(self, results: list[Any]) -> None:
        for listener in self._listeners:
            listener(results)

    def write(self, job: Callable[[sqlite3.Connection], Any]) -> Future:
        """Run ``job(conn)`` on the writer thread in the next group commit."""
        if self._writer is None:
            raise RuntimeError("store is not open")
        return self._writer.submit(job)

    @property
    def writes_failing(self) -> bool:
        """The last group commit failed (disk full, I/O error); the next success clears it."""
        return bool(self._writer and self._writer.failing)

    @property
    def commits(self) -> int:
        return self._writer.commits if self._writer else 0

    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.path.getsize(self.path + suffix)
            except OSError:
                pass
        return total

    # -- writes ---------------------------------------------------------------------------
    def submit_metrics(self, run_id: str, batch: MetricBatch, digest: str) -> Future:
        return self._run_job(run_id, lambda conn: self._ingest(conn, run_id, batch, digest))

    def _ensure_run(self, conn: sqlite3.Connection, run_id: str, now: float) -> RunState:
        st = self._runs.get(run_id)
        if st is None:
            conn.execute("INSERT OR IGNORE INTO runs (run_id, created_at, updated_at) VALUES (?, ?, ?)",
                         (run_id, now, now))
            st = self._runs[run_id] = RunState(run_id)
        return st

    def _ingest(self, conn: sqlite3.Connection, run_id: str, batch: MetricBatch, digest: str) -> IngestResult:
        now = self._clock()
        st = self._ensure_run(conn, run_id, now)
        cur = conn.execute("INSERT OR IGNORE INTO batches VALUES (?, ?, ?, ?)", (run_id, digest, len(batch), now))
        if cur.rowcount == 0:
            n = conn.execute("SELECT n_records FROM batches WHERE run_id=? AND digest=?", (run_id, digest)).fetchone()[0]
            return IngestResult(run_id, n, True, st.attempt, False, None, now)
        if len(batch) == 0:
            return IngestResult(run_id, 0, False, st.attempt, False, None, now)
        # First everything that can fail (the SQL), computed from the state without changing it;
        # then the in-memory state, which cannot fail. A failed job leaves both untouched.
        new_attempt = st.needs_new_attempt(batch)
        attempt = st.attempt + 1 if new_attempt else st.attempt
        step_min, step_max = int(batch.steps.min()), int(batch.steps.max())
        hosts = st.host_updates(batch)
        if new_attempt:
            conn.execute("INSERT INTO attempts VALUES (?, ?, ?, ?)", (run_id, attempt, step_min, now))
        if hosts:
            conn.executemany("INSERT OR REPLACE INTO hosts VALUES (?, ?, ?)", [(run_id, r, h) for r, h in hosts])
        cur = conn.execute(
            "INSERT INTO chunks (run_id, attempt, step_min, step_max, n_records, n_points, fields, has_hosts,"
            " received_at, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, attempt, step_min, step_max, len(batch), batch.n_points, ",".join([*batch.values, *batch.labels]),
             batch.host_index is not None, now, encode_chunk(batch)))
        chunk_id = cur.lastrowid
        if st.finished:  # data after the run finished: it resumed
            conn.execute("UPDATE runs SET status='running', finished_at=NULL, updated_at=? WHERE run_id=?",
                         (now, run_id))

        if new_attempt:
            st.open_attempt(step_min)
        st.advance(batch)
        st.set_hosts(hosts)
        st.finished = False
        if st.finished_ranks:  # a rank that said finish and reports again has resumed
            st.finished_ranks.difference_update(np.unique(batch.ranks).tolist())
        # Per-attempt progress and the last push are derivable from the chunks: kept in memory,
        # rebuilt from the chunks table on open, not written per batch.
        st.record_push(step_max, len(batch), now)
        if now - self._last_prune >= min(60.0, self.dedupe_window_s / 4):
            self._last_prune = now
            conn.execute("DELETE FROM batches WHERE received_at < ?", (now - self.dedupe_window_s,))
        if now - self._last_snapshot.get(run_id, 0.0) >= self.snapshot_every_s:
            try:
                self._write_snapshot(conn, run_id, st)
            except sqlite3.Error:  # a snapshot is an optimisation: never fail the batch for it
                log.exception("snapshot of run %s failed; the next batch tries again", run_id)
        return IngestResult(run_id, len(batch), False, st.attempt, new_attempt, chunk_id, now, batch)

    def _write_snapshot(self, conn: sqlite3.Connection, run_id: str, st: RunState) -> None:
        (watermark,) = conn.execute("SELECT coalesce(max(id), 0) FROM chunks WHERE run_id=?", (run_id,)).fetchone()
        conn.execute("INSERT OR REPLACE INTO run_state VALUES (?, 'ingest', ?, ?)",
                     (run_id, watermark, orjson.dumps(st.to_dict())))
        self._last_snapshot[run_id] = self._clock()

    def _snapshot_all(self, conn: sqlite3.Connection) -> None:
        for run_id, st in self._runs.items():
            self._write_snapshot(conn, run_id, st)

    def _reload_run_states(self) -> None:
        """A group commit failed (disk full, I/O error): what the jobs changed in memory was not
        stored, so rebuild the in-memory run state from what is (runs, attempts, chunks)."""
        self._runs = {}
        self._load_run_states(self._write_conn)

    def _run_job(self, run_id: str, fn: Callable[[sqlite3.Connection], Any]) -> Future:
        """A write that may create the run: if it fails, the run's row is rolled back with it,
        so the in-memory state must forget a run this job created (no phantom run that takes
        pushes but answers 404)."""
        def job(conn: sqlite3.Connection) -> Any:
            existed = run_id in self._runs
            try:
                return fn(conn)
            except BaseException:
                if not existed:
                    self._runs.pop(run_id, None)
                raise
        return self.write(job)

    def _load_run_states(self, conn: sqlite3.Connection) -> None:
        """Rebuild each run's ingest state: its snapshot, then the chunks written after it."""
        snapshots = {r: (w, s) for r, w, s in conn.execute(
            "SELECT run_id, watermark, state FROM run_state WHERE kind='ingest'")}
        attempts = {(r, a): s for r, a, s in conn.execute("SELECT run_id, attempt, start_step FROM attempts")}
        for (run_id, status) in conn.execute("SELECT run_id, status FROM runs").fetchall():
            if run_id in snapshots:
                watermark, state = snapshots[run_id]
                st = RunState.from_dict(run_id, orjson.loads(state))
            else:
                watermark, st = 0, RunState(run_id)
            for attempt, payload in conn.execute(
                    "SELECT attempt, payload FROM chunks WHERE run_id=? AND id>? ORDER BY id", (run_id, watermark)):
                if attempt != st.attempt:
                    st.attempt = attempt - 1
                    st.open_attempt(attempts[(run_id, attempt)])
                batch = decode_chunk(payload, fields=set())
                st.advance(batch)
                st.set_hosts(st.host_updates(batch))
            st.finished = status == "finished"
            for attempt, last_step, n_records, last_push in conn.execute(
                    "SELECT attempt, max(step_max), sum(n_records), max(received_at) FROM chunks WHERE run_id=?"
                    " GROUP BY attempt", (run_id,)):
                st.attempt_progress[attempt] = [last_step, n_records]
                st.last_push = max(st.last_push or 0.0, last_push)
            self._runs[run_id] = st

    def submit_run_config(self, run_id: str, config: dict) -> Future:
        def job(conn: sqlite3.Connection) -> dict:
            now = self._clock()
            self._ensure_run(conn, run_id, now)
            conn.execute("UPDATE runs SET config=?, updated_at=? WHERE run_id=?", (orjson.dumps(config), now, run_id))
            return RunEvent(run_id, "config", config, now)
        return self._run_job(run_id, job)

    def submit_checkpoint(self, run_id: str, step: int, uri: str, duration_s: float | None,
                          nbytes: int | None) -> Future:
        def job(conn: sqlite3.Connection) -> RunEvent:
            # A checkpoint registered before any metrics belongs to the first attempt, which
            # opens with the first metrics.
            now = self._clock()
            st = self._ensure_run(conn, run_id, now)
            conn.execute(
                "INSERT INTO checkpoints (run_id, step, uri, attempt, duration_s, bytes, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, step, uri) DO UPDATE SET"
                " duration_s=coalesce(excluded.duration_s, duration_s), bytes=coalesce(excluded.bytes, bytes)",
                (run_id, step, uri, max(st.attempt, 1), duration_s, nbytes, now))
            (ckpt_id,) = conn.execute("SELECT id FROM checkpoints WHERE run_id=? AND step=? AND uri=?",
                                      (run_id, step, uri)).fetchone()
            return RunEvent(run_id, "checkpoint", {"id": ckpt_id, "step": step, "uri": uri,
                                                   "attempt": max(st.attempt, 1), "duration_s": duration_s,
                                                   "bytes": nbytes}, now)
        return self._run_job(run_id, job)

    def submit_checkpoint_status(self, run_id: str, checkpoint_id: int, status: str, note: str | None) -> Future:
        def job(conn: sqlite3.Connection) -> int:
            cur = conn.execute("UPDATE checkpoints SET status=?, note=coalesce(?, note) WHERE run_id=? AND id=?",
                               (status, note, run_id, checkpoint_id))
            return cur.rowcount
        return self.write(job)

    def submit_event(self, run_id: str, kind: str, step: int | None, data: dict) -> Future:
        def job(conn: sqlite3.Connection) -> RunEvent:
            now = self._clock()
            st = self._ensure_run(conn, run_id, now)
            cur = conn.execute("INSERT INTO events (run_id, kind, step, attempt, ts, data) VALUES (?, ?, ?, ?, ?, ?)",
                               (run_id, kind, step, st.attempt, now, orjson.dumps(data)))
            return RunEvent(run_id, "event", {"id": cur.lastrowid, "kind": kind, "step": step,
                                              "attempt": st.attempt, "data": data}, now)
        return self._run_job(run_id, job)

    def submit_heartbeat(self, run_id: str, rank: int, step: int | None, phase: str | None) -> Future:
        def job(conn: sqlite3.Connection) -> RunEvent:
            now = self._clock()
            self._ensure_run(conn, run_id, now)
            conn.execute("INSERT OR REPLACE INTO heartbeats VALUES (?, ?, ?, ?, ?)", (run_id, rank, step, phase, now))
            return RunEvent(run_id, "heartbeat", {"rank": rank, "step": step, "phase": phase}, now)
        return self._run_job(run_id, job)

    def submit_finish(self, run_id: str, rank: int | None = None) -> Future:
        """The run (``rank=None``) or one rank finished. The run is finished once every rank that
        reported in the current attempt has finished: ranks finish one by one, and records of a
        rank still finishing must not reopen a run another rank has already called finished."""
        def job(conn: sqlite3.Connection) -> RunEvent:
            now = self._clock()
            st = self._ensure_run(conn, run_id, now)
            if rank is not None:
                st.finished_ranks.add(rank)
                if not set(st.ranks_seen().tolist()) <= st.finished_ranks:
                    return RunEvent(run_id, "rank_finished", {"rank": rank}, now)
            conn.execute("UPDATE runs SET status='finished', finished_at=?, updated_at=? WHERE run_id=?",
                         (now, now, run_id))
            st.finished = True
            return RunEvent(run_id, "finish", {}, now)
        return self._run_job(run_id, job)

    # -- reads ----------------------------------------------------------------------------
    def run_state(self, run_id: str) -> RunState | None:
        return self._runs.get(run_id)

    def run_exists(self, run_id: str) -> bool:
        return self.read_conn().execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is not None

    def list_run_rows(self) -> list[dict]:
        rows = self.read_conn().execute(
            "SELECT run_id, created_at, updated_at, config, status, finished_at FROM runs ORDER BY created_at")
        return [self._run_row(r) for r in rows]

    def get_run_row(self, run_id: str) -> dict | None:
        r = self.read_conn().execute(
            "SELECT run_id, created_at, updated_at, config, status, finished_at FROM runs WHERE run_id=?",
            (run_id,)).fetchone()
        return None if r is None else self._run_row(r)

    @staticmethod
    def _run_row(r: tuple) -> dict:
        return {"run_id": r[0], "created_at": r[1], "updated_at": r[2], "config": orjson.loads(r[3]),
                "status": r[4], "finished_at": r[5]}

    def attempts(self, run_id: str) -> list[dict]:
        st = self._runs.get(run_id)
        progress = dict(st.attempt_progress) if st else {}
        rows = self.read_conn().execute(
            "SELECT attempt, start_step, opened_at FROM attempts WHERE run_id=? ORDER BY attempt", (run_id,))
        out = []
        for a, s, t in rows:
            last_step, n = progress.get(a, (s, 0))
            out.append({"attempt": a, "start_step": s, "last_step": last_step, "n_records": n, "opened_at": t})
        return out

    def hosts(self, run_id: str) -> dict[int, str]:
        return dict(self.read_conn().execute("SELECT rank, host FROM hosts WHERE run_id=?", (run_id,)))

    def checkpoints(self, run_id: str) -> list[dict]:
        rows = self.read_conn().execute(
            "SELECT id, step, uri, attempt, duration_s, bytes, created_at, status, note FROM checkpoints"
            " WHERE run_id=? ORDER BY step, id", (run_id,))
        keys = ("id", "step", "uri", "attempt", "duration_s", "bytes", "created_at", "status", "note")
        return [dict(zip(keys, r)) for r in rows]

    def events(self, run_id: str) -> list[dict]:
        rows = self.read_conn().execute(
            "SELECT id, kind, step, attempt, ts, data FROM events WHERE run_id=? ORDER BY id", (run_id,))
        return [{"id": i, "kind": k, "step": s, "attempt": a, "ts": t, "data": orjson.loads(d)}
                for i, k, s, a, t, d in rows]

    def heartbeats(self, run_id: str) -> list[dict]:
        rows = self.read_conn().execute(
            "SELECT rank, step, phase, ts FROM heartbeats WHERE run_id=? ORDER BY rank", (run_id,))
        return [{"rank": r, "step": s, "phase": p, "ts": t} for r, s, p, t in rows]

    def fields(self, run_id: str) -> tuple[list[str], bool]:
        """Metric fields ever reported by the run (in first-seen order), and whether hosts were."""
        names: list[str] = []
        has_hosts = False
        for fields, hosts in self.read_conn().execute(
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
        conn = self.read_conn()
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
