"""What both stores share: the writer thread with group commit, listeners, migrations on open,
snapshot and replay, and the tables it is composed of.

:class:`~healthsvc.store.sqlite.SQLiteStore` and :class:`~healthsvc.store.postgres.PostgresStore`
differ only in how they connect (and in the SQL dialect, which ``dialect`` translates): each
implements ``_writer_connection``, ``_migrate``, ``_run_script``, ``read_conn``, ``size_bytes``
and ``check_schema``. Everything else is this class's or one of the objects it holds:
``store.ingest`` (the metrics and the runs' in-memory states, which it alone holds),
``store.reads`` (runs and their history), ``store.control`` (the writes that are not metrics),
``store.findings``, ``store.bisections``, ``store.probes``, ``store.tokens`` and ``store.audit``,
each built with the store's writer and reader (:class:`~healthsvc.store.seam.TableAccess`) and
what else it needs by name (the ingest's runs, a clock).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterator, Sequence

from healthsvc.store import snapshots
from healthsvc.store.bisections import BisectionsTable
from healthsvc.store.control import ControlWrites
from healthsvc.store.fencing import Fence
from healthsvc.store.findings import FindingsTable
from healthsvc.store.ingest import MetricsIngest
from healthsvc.store.probes import ProbesTable
from healthsvc.store.quotas import Quotas
from healthsvc.store.reads import StoreReads
from healthsvc.store.sharing import DatabaseSharing, SoleWriter
from healthsvc.store.snapshots import Snapshot, SnapshotKind, StoredChunk
from healthsvc.store.tokens import AuditLog, TokensTable
from healthsvc.store.writer import GroupCommitWriter

log = logging.getLogger(__name__)


class StoreBase:
    path: str
    # The tables, each its own object (see ``interface``: FindingsStore, BisectionStore, ...).
    ingest: MetricsIngest
    reads: StoreReads
    control: ControlWrites
    findings: FindingsTable
    bisections: BisectionsTable
    probes: ProbesTable
    tokens: TokensTable
    audit: AuditLog
    # Who else writes the runs (the store's one seam for replicas, ``sharing``): SQLite serves
    # one process; PostgreSQL's store is shared by replicas.
    sharing: DatabaseSharing = SoleWriter()
    _ingest_class: type[MetricsIngest] = MetricsIngest   # PostgreSQL's appends in one statement

    def __init__(self, *, snapshot_every_s: float = 5.0, dedupe_window_s: float = 3600.0,
                 clock: Callable[[], float] = time.time, quotas: Quotas = Quotas()) -> None:
        self._listeners: list[Callable[[list[Any]], None]] = []
        self._local = threading.local()
        self._writer: GroupCommitWriter | None = None
        self._write_conn: Any = None
        self._schemas: list[str] = []   # features' own idempotent DDL (register_schema)
        self.ingest = self._ingest_class(self, clock, quotas=quotas, snapshot_every_s=snapshot_every_s,
                                         dedupe_window_s=dedupe_window_s, sharing=self.sharing)
        self.reads = StoreReads(self, self.ingest)
        self.control = ControlWrites(self, self.ingest, clock, sharing=self.sharing)
        self.findings = FindingsTable(self, clock, self.ingest.hosts_of)
        self.bisections = BisectionsTable(self, clock)
        self.probes = ProbesTable(self)
        self.tokens = TokensTable(self, self._watch_tokens)
        self.audit = AuditLog(self)

    # -- what each store implements ---------------------------------------------------------
    def _writer_connection(self) -> Any:
        raise NotImplementedError

    def _migrate(self, conn: Any) -> list[int]:
        raise NotImplementedError

    def _run_script(self, conn: Any, script: str) -> None:
        raise NotImplementedError

    def read_conn(self) -> Any:
        raise NotImplementedError

    def size_bytes(self) -> int:
        raise NotImplementedError

    def check_schema(self) -> int:
        """The database's schema version, without changing it; raises
        :class:`~healthsvc.store.migrations.SchemaTooNew` if the code is older than the database."""
        raise NotImplementedError

    def _watch_tokens(self, on_change: Callable[[], None]) -> None:
        """The tokens table's watcher: one process holds a SQLite file, and its own changes go
        through it, so there is nothing to watch (PostgreSQL's store listens)."""

    # -- lifecycle ------------------------------------------------------------------------
    def open(self) -> None:
        conn = self._writer_connection()
        try:
            applied = self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        if applied:
            log.info("store %s migrated to schema version %d", self.path, applied[-1])
        for script in self._schemas:
            self._run_script(conn, script)
        self._write_conn = conn
        self.ingest.load(conn)
        self._writer = GroupCommitWriter(conn, after_commit=self._notify,
                                         after_rollback=lambda: self.ingest.reload(conn))
        self._writer.start()

    def close(self) -> None:
        if self._writer is None:
            return
        fut = self._writer.submit(self.ingest.snapshot_all)
        try:
            fut.result(timeout=10)
        except Exception:
            log.exception("final snapshot failed")
        self._writer.stop()
        self._writer = None
        if self._write_conn is not None:
            self._write_conn.close()
        self._close_readers()

    def _close_readers(self) -> None:
        pass

    def register_schema(self, script: str) -> None:
        """Idempotent DDL (CREATE ... IF NOT EXISTS, SQLite's dialect) of a feature's tables, run
        after the migrations; call before open(). A table the service keeps belongs in a
        numbered migration (``migrations``) instead."""
        if self._writer is not None:
            raise RuntimeError("register_schema() must be called before the store opens")
        self._schemas.append(script)

    def subscribe(self, listener: Callable[[list[Any]], None]) -> None:
        """``listener(results)`` runs on the writer thread after each commit; keep it quick."""
        self._listeners.append(listener)

    def _notify(self, results: list[Any]) -> None:
        for listener in self._listeners:
            listener(results)

    def write(self, job: Callable[[Any], Any], fence: Fence | None = None) -> Future:
        """Run ``job(conn)`` on the writer thread in the next group commit; with a ``fence``
        (replicas: :class:`~healthsvc.ownership.Fence`) only while that lease holds
        (else the job fails alone with :class:`~healthsvc.ownership.leases.LeaseLost`)."""
        if self._writer is None:
            raise RuntimeError("store is not open")
        if fence is not None:
            inner = job

            def job(conn: Any) -> Any:
                self._check_fence(conn, fence)
                return inner(conn)
        return self._writer.submit(job)

    def _check_fence(self, conn: Any, fence: Fence) -> None:
        """A store whose runs can change hands checks the lease (PostgreSQL); one process owns
        every run of a SQLite file, so there is nothing to check."""

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

    # -- snapshot and replay (see ``snapshots``) -------------------------------------------
    def save_snapshot(self, run_id: str, kind: SnapshotKind, watermark: int, state: bytes,
                      fence: Fence | None = None) -> Future:
        """Replace the run's snapshot of ``kind`` (in the next group commit; see ``write`` for ``fence``)."""
        return self.write(lambda conn: snapshots.write_snapshot(conn, run_id, kind, watermark, state), fence)

    def snapshots(self, kind: SnapshotKind) -> dict[str, Snapshot]:
        return snapshots.read_snapshots(self.read_conn(), kind)

    def snapshot(self, run_id: str, kind: SnapshotKind) -> Snapshot | None:
        """One run's snapshot of ``kind`` (one indexed read), or None."""
        return snapshots.read_snapshots(self.read_conn(), kind, run_id).get(run_id)

    def chunks_after(self, run_id: str, watermark: int, fields: set[str] | None = None) -> Iterator[StoredChunk]:
        """The run's stored chunks after ``watermark`` (a chunk id), oldest first: what replay feeds."""
        return snapshots.chunks_after(self.read_conn(), run_id, watermark, fields)

    def chunks_by_id(self, run_id: str, ids: Sequence[int], fields: set[str] | None = None) -> Iterator[StoredChunk]:
        """The run's stored chunks among ``ids``, oldest first: what a notification announced."""
        return snapshots.chunks_by_id(self.read_conn(), run_id, ids, fields)
