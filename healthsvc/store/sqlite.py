"""The embedded store: one SQLite file in WAL mode, one writer thread, many readers.

Metrics are stored as one compressed columnar chunk per accepted batch (see ``codec``), never one
row per rank. Writes go through :class:`GroupCommitWriter`; reads use a connection per thread.
``synchronous=FULL`` makes a commit durable before the request that caused it is answered.

What the two stores share (the writer, migrations on open, every table's module: ``ingest``,
``control``, ``reads``, ``findings``, ``bisections``, ``probes``, ``tokens``, ``snapshots``) is
:class:`~healthsvc.store.base.StoreBase`'s; this module is how SQLite connects. What the rest of
the service may call is :class:`healthsvc.store.interface.Store`.
"""
from __future__ import annotations

import os
import sqlite3
import time
from typing import Callable

from healthsvc.store import migrations
from healthsvc.store.base import StoreBase
from healthsvc.store.quotas import Quotas
from healthsvc.store.results import IngestResult, RunEvent

__all__ = ["IngestResult", "RunEvent", "SQLiteStore", "sqlite_path_from_uri"]


def sqlite_path_from_uri(uri: str) -> str:
    """``sqlite:///rel/path.db``, ``sqlite:////abs/path.db`` or a plain path."""
    if uri.startswith("sqlite:///"):
        return uri[len("sqlite:///"):]
    if uri.startswith("sqlite://"):
        raise ValueError(f"bad SQLite URI {uri!r}: use sqlite:///relative.db or sqlite:////absolute.db")
    if "://" in uri:
        raise ValueError(f"unsupported store URI {uri!r}: use sqlite:///PATH or postgresql://user@host:port/db")
    return uri


class SQLiteStore(StoreBase):
    def __init__(self, uri: str, *, snapshot_every_s: float = 5.0, dedupe_window_s: float = 3600.0,
                 clock: Callable[[], float] = time.time, quotas: Quotas = Quotas()) -> None:
        super().__init__(snapshot_every_s=snapshot_every_s, dedupe_window_s=dedupe_window_s, clock=clock,
                         quotas=quotas)
        self.path = sqlite_path_from_uri(uri)

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    def _writer_connection(self) -> sqlite3.Connection:
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        return self._connect()

    def _migrate(self, conn: sqlite3.Connection) -> list[int]:
        return migrations.migrate(conn, "sqlite", self.path, time.time())

    def _run_script(self, conn: sqlite3.Connection, script: str) -> None:
        conn.executescript(script)

    def check_schema(self) -> int:
        if not os.path.exists(self.path):
            return 0
        conn = sqlite3.connect(f"file:{os.path.abspath(self.path)}?mode=ro", uri=True)
        try:
            return migrations.check_version(conn, "sqlite", self.path)
        finally:
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        _use_wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def read_conn(self) -> sqlite3.Connection:
        """A connection owned by the calling thread, for reads."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=ON")
            self._local.conn = conn
        return conn

    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.path.getsize(self.path + suffix)
            except OSError:
                pass
        return total


def _use_wal(conn: sqlite3.Connection, timeout_s: float = 30.0) -> None:
    """Put the file in WAL mode. Turning a new file to WAL takes an exclusive lock that SQLite
    does not wait for (the busy timeout does not apply), so processes opening one new file
    together would see "database is locked": retry until one of them has done it."""
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)   # a lock held by another opener: back off, then ask again
            delay = min(delay * 2, 0.1)
