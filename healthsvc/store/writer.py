"""One writer thread with group commit.

Every write to the database is a job: a function of the connection. The writer takes every job
waiting in its queue, runs each inside its own SAVEPOINT (a failing job rolls back alone; the first
needs none), commits once, and only then resolves the jobs' futures. Many concurrent requests therefore share one
fsync, and a request is answered only once its data is durable. (A group of one job on
PostgreSQL may run that job's one statement as its own transaction: ``PgConnection.solo``.)
"""
from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from concurrent.futures import Future
from typing import Any, Callable

log = logging.getLogger(__name__)

Job = Callable[[Any], Any]   # of a sqlite3 connection, or ``postgres.PgConnection``


def is_io_error(exc: BaseException) -> bool:
    """A write failed for the disk's (or the database server's) sake: full, I/O error,
    read-only, connection lost; not for the job's."""
    if type(exc).__module__.startswith("psycopg"):
        return type(exc).__name__ in ("OperationalError", "DiskFull", "InsufficientResources",
                                      "ReadOnlySqlTransaction", "AdminShutdown")
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    text = str(exc).lower()
    return any(w in text for w in ("full", "disk", "i/o", "readonly", "read-only"))


class WriterStopped(RuntimeError):
    """The store is closed; the write was not performed."""


class GroupCommitWriter:
    def __init__(self, conn: Any, *, max_group: int = 512,
                 after_commit: Callable[[list[Any]], None] | None = None,
                 after_rollback: Callable[[], None] | None = None) -> None:
        self._conn = conn
        self._after_rollback = after_rollback
        self.failing = False          # the last group commit failed (readiness reports it)
        self._queue: queue.Queue[tuple[Job, Future] | None] = queue.Queue()
        self._max_group = max_group
        self._after_commit = after_commit
        self._thread = threading.Thread(target=self._loop, name="healthsvc-writer", daemon=True)
        self._stopped = False
        self.commits = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> Future:
        fut: Future = Future()
        if self._stopped:
            fut.set_exception(WriterStopped("the store is closed"))
            return fut
        self._queue.put((job, fut))
        return fut

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            group = [item]
            while len(group) < self._max_group:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)  # finish this group, then stop
                    break
                group.append(nxt)
            self._run_group(group)

    def _run_group(self, group: list[tuple[Job, Future]]) -> None:
        conn = self._conn
        outcomes: list[tuple[Future, bool, Any]] = []
        io_failed = False
        if hasattr(conn, "lone"):
            # A lone job's one statement may commit by itself (PostgreSQL: PgConnection.solo).
            conn.lone = len(group) == 1
        try:
            conn.execute("BEGIN IMMEDIATE")
            # A job's savepoint protects the jobs stored before it in this transaction; a job
            # with none before it (the first, or the first after failures) needs none: if it
            # fails, the whole transaction is rolled back and begun again. (On PostgreSQL a
            # savepoint and its release are a round trip and two statements of a push's five.)
            holds_work = False
            for job, fut in group:
                if holds_work:
                    conn.execute("SAVEPOINT job")
                try:
                    result = job(conn)
                except BaseException as exc:  # noqa: BLE001 - the job's error goes to its caller
                    if holds_work:
                        conn.execute("ROLLBACK TO job")
                        conn.execute("RELEASE job")
                    else:
                        conn.execute("ROLLBACK")
                        conn.execute("BEGIN IMMEDIATE")
                    outcomes.append((fut, False, exc))
                    io_failed = io_failed or is_io_error(exc)
                else:
                    if holds_work:
                        conn.execute("RELEASE job")
                    holds_work = True
                    outcomes.append((fut, True, result))
            conn.execute("COMMIT")
            self.commits += 1
        except Exception as exc:  # the commit itself failed: nothing of the group is durable
            log.exception("group commit failed")
            try:
                conn.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the connection may be gone; the group failed anyway
                pass
            self.failing = True
            if self._after_rollback is not None:
                try:
                    self._after_rollback()
                except Exception:
                    log.exception("after-rollback hook failed")
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)
            return
        self.failing = io_failed
        results = [res for _, ok, res in outcomes if ok]
        for fut, ok, res in outcomes:
            if ok:
                fut.set_result(res)
            else:
                fut.set_exception(res)
        if self._after_commit is not None:
            try:
                self._after_commit(results)
            except Exception:  # a listener must never break ingest
                log.exception("after-commit listener failed")
