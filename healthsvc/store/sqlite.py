"""The embedded store: one SQLite file in WAL mode, one writer thread, many readers.

Metrics are stored as one compressed columnar chunk per accepted batch (see ``codec``), never one
row per rank. Writes go through :class:`GroupCommitWriter`; reads use a connection per thread.
``synchronous=FULL`` makes a commit durable before the request that caused it is answered.

:class:`SQLiteStore` is assembled from modules of one concept each: ``ingest`` (the metrics write
path and the run states), ``control`` (config, checkpoints, events, heartbeats, finish),
``reads``, ``findings``, ``bisections``, ``probes``, ``tokens`` (and the audit log), and ``snapshots`` (snapshot and replay, for every owner
of in-memory state). What the
rest of the service may call is :class:`healthsvc.store.interface.Store`.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterator

from healthsvc.store import bisections, findings, probes, snapshots, tokens
from healthsvc.store.bisections import BisectionsTable
from healthsvc.store.control import ControlWrites
from healthsvc.store.findings import FindingsTable
from healthsvc.store.ingest import MetricsIngest
from healthsvc.store.probes import ProbesTable
from healthsvc.store.reads import StoreReads
from healthsvc.store.results import IngestResult, RunEvent
from healthsvc.store.runstate import RunState
from healthsvc.store.schema import SCHEMA
from healthsvc.store.snapshots import Snapshot, SnapshotKind, StoredChunk
from healthsvc.store.tokens import TokensTable
from healthsvc.store.writer import GroupCommitWriter

__all__ = ["IngestResult", "RunEvent", "SQLiteStore", "sqlite_path_from_uri"]

log = logging.getLogger(__name__)


def sqlite_path_from_uri(uri: str) -> str:
    """``sqlite:///rel/path.db``, ``sqlite:////abs/path.db`` or a plain path."""
    if uri.startswith("sqlite:///"):
        return uri[len("sqlite:///"):]
    if uri.startswith("sqlite://"):
        raise ValueError(f"bad SQLite URI {uri!r}: use sqlite:///relative.db or sqlite:////absolute.db")
    if "://" in uri:
        raise ValueError(f"unsupported store URI {uri!r}: this build supports sqlite:///PATH")
    return uri


class SQLiteStore(MetricsIngest, ControlWrites, StoreReads, FindingsTable, BisectionsTable,
                  ProbesTable, TokensTable):
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
        self._schemas: list[str] = [SCHEMA, findings.SCHEMA, bisections.SCHEMA, probes.SCHEMA,
                                     tokens.SCHEMA]

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

    def barrier(self) -> Future:
        """An empty write: resolves once every write queued before it is committed and its
        after-commit listeners have run (the drain barrier's first stage)."""
        return self.write(lambda conn: None)

    def ping(self) -> None:
        """Raise unless the store answers a read (readiness)."""
        self.read_conn().execute("SELECT 1").fetchone()

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

    # -- snapshot and replay (see ``snapshots``) -------------------------------------------
    def save_snapshot(self, run_id: str, kind: SnapshotKind, watermark: int, state: bytes) -> Future:
        """Replace the run's snapshot of ``kind`` (in the next group commit)."""
        return self.write(lambda conn: snapshots.write_snapshot(conn, run_id, kind, watermark, state))

    def snapshots(self, kind: SnapshotKind) -> dict[str, Snapshot]:
        return snapshots.read_snapshots(self.read_conn(), kind)

    def chunks_after(self, run_id: str, watermark: int, fields: set[str] | None = None) -> Iterator[StoredChunk]:
        """The run's stored chunks after ``watermark`` (a chunk id), oldest first: what replay feeds."""
        return snapshots.chunks_after(self.read_conn(), run_id, watermark, fields)
