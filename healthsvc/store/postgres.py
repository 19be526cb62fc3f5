"""The PostgreSQL store: ``--db postgresql://user@host:5432/db`` (psycopg 3, a pool for reads).

The same store as SQLite's (:class:`~healthsvc.store.base.StoreBase`: one writer thread with
group commit, so writes are ordered and after-commit listeners see what SQLite's see), over a
:class:`PgConnection` that runs the store's SQLite-dialect SQL translated (``dialect``). Reads
borrow a connection from a :class:`psycopg_pool.ConnectionPool` (``pool_size``, 8) for one
statement and return it: each read sees every commit made before it (the writer resolves a write
only once committed). Reads of chunk payloads stream (:class:`StreamedRows`) and hold their
connection while the caller iterates. A writer connection that broke is replaced before the next
group (:class:`PgConnection`); several processes may open one database (migrations take turns).

Types: ``REAL`` columns are ``DOUBLE PRECISION`` (float64, NaN and ±Inf kept bit for bit), the
metric chunks are ``BYTEA`` (the same bytes as SQLite's ``BLOB``: NaN versus missing is the codec's
presence bitmap, so it survives byte for byte); ``numeric`` results (``sum`` of a ``BIGINT``)
come back as int.
"""
from __future__ import annotations

import functools
import logging
import re
import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from decimal import Decimal
from typing import Any, Callable, Iterator, Sequence

import psycopg
from psycopg.adapt import Loader
from psycopg.types.string import BytesBinaryDumper
from psycopg_pool import ConnectionPool

from healthsvc.store.batch import MetricBatch
from healthsvc.store import migrations
from healthsvc.store.base import StoreBase
from healthsvc.store.quotas import Quotas
from healthsvc.store.dialect import Catalog, Statement, pg_ddl, pg_plain, pg_statement, split_script
from healthsvc.store.ingest import CHUNK_COLUMNS, CHUNK_PLACES, Appended, MetricsIngest, chunk_row
from healthsvc.store.open import is_postgres_uri, redact
from healthsvc.store.runstate import RunState
from healthsvc.store.sharing import SharedWriters

log = logging.getLogger(__name__)

# Every migrator of one database takes this lock (pg_advisory_xact_lock), so replicas starting
# together apply each step once.
MIGRATION_LOCK = 0x6865616c7468   # "health"


class _NumericAsNumber(Loader):
    """``numeric`` as int when whole (``sum`` of integers), else float: what SQLite returns."""

    def load(self, data: Any) -> int | float:
        d = Decimal(bytes(data).decode())
        return int(d) if d == d.to_integral_value() else float(d)


def _configure(conn: psycopg.Connection) -> None:
    conn.adapters.register_loader("numeric", _NumericAsNumber)
    # Chunks travel as binary parameters, not hex text: half the bytes on the wire, no escaping.
    conn.adapters.register_dumper(bytes, BytesBinaryDumper)


class PgCursor:
    """The rows of one statement, fetched at once, with sqlite3's cursor API."""

    __slots__ = ("_rows", "rowcount", "lastrowid")

    def __init__(self, rows: list[tuple], rowcount: int, lastrowid: int | None) -> None:
        self._rows, self.rowcount, self.lastrowid = rows, rowcount, lastrowid

    def fetchone(self) -> tuple | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple]:
        return self._rows

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._rows)


def _has_rows(cur: psycopg.Cursor) -> bool:
    """Whether the statement returned rows (``cur.description`` tells too, but builds a column
    description each time: a tenth of a push's statement)."""
    res = cur.pgresult
    return res is not None and res.status == _TUPLES_OK


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


def _params(args: Sequence[Any]) -> list[Any]:
    # SQLite stores a bool as 0/1 in an INTEGER column; PostgreSQL will not cast it on insert.
    # (Always a list, never None: psycopg then reads %% in the statement as %.)
    return [int(a) if isinstance(a, bool) else a for a in args]


# Transaction control without parameters: BEGIN and savepoints are held back and sent with the
# next statement of their kind (``RELEASE job; SAVEPOINT job`` between two jobs of a group, one
# round trip instead of two); COMMIT and ROLLBACK [TO] go at once, with what is held.
_DEFERRED = re.compile(r"^\s*(BEGIN|SAVEPOINT|RELEASE)\b", re.IGNORECASE)
_ENDS = re.compile(r"^\s*(COMMIT|ROLLBACK)\b", re.IGNORECASE)
_FULL_ROLLBACK = re.compile(r"^\s*ROLLBACK\s*$", re.IGNORECASE)
_JOB_SAVEPOINT_END = re.compile(r"^\s*(ROLLBACK\s+TO|RELEASE)\s+job\s*$", re.IGNORECASE)


def _control(sql: str) -> str:
    """'defer', 'end', 'rollback' (the whole transaction) or '' for any other statement."""
    if _FULL_ROLLBACK.match(sql):
        return "rollback"
    if _ENDS.match(sql):
        return "end"
    return "defer" if _DEFERRED.match(sql) else ""


_NO_ROWS = PgCursor([], -1, None)


class PgConnection:
    """A psycopg connection (autocommit: the writer and the migrations say BEGIN and COMMIT)
    with sqlite3's methods, running SQLite-dialect statements translated.

    Parameterless BEGIN, SAVEPOINT and RELEASE are sent with the next statement (a writer's group
    of single-record pushes ran four of them per push, each a round trip and a parse on the
    server); ``raw`` sends what is held first, so a caller using the psycopg connection itself
    sees the transaction as it was asked for. A held statement that fails raises from the
    statement it went with.

    :meth:`solo` runs a statement whose effect may stand alone (the usual push's append) as a
    job's first: for a lone job, outside the transaction the writer began, committing by itself
    (one round trip where BEGIN, the statement and COMMIT took three; the writer says when its
    group is one job: ``lone``); for a later job of a group, without the savepoint the writer
    asked for (taken after the statement, if the job runs another), so the job's write costs one
    round trip where ``RELEASE job; SAVEPOINT job`` and the statement took two."""

    dialect = "postgresql"   # for the few statements only PostgreSQL has (FOR UPDATE SKIP LOCKED)

    def __init__(self, conn: psycopg.Connection, catalog: Catalog,
                 reconnect: Callable[[], psycopg.Connection] | None = None) -> None:
        self._raw = conn
        self.catalog = catalog
        self._reconnect = reconnect
        self._in_transaction = False
        self._held: list[str] = []
        self.lone = False             # the writer's group is one job (set by the writer)
        self._begin_later = False     # a solo statement took the transaction's BEGIN
        self._savepoint_later = False # a solo statement took its job's savepoint
        self._doomed: BaseException | None = None   # a solo statement failed in the transaction
        self._translate = functools.lru_cache(maxsize=1024)(
            lambda sql: (pg_statement(sql, catalog), _control(sql)))

    @property
    def raw(self) -> psycopg.Connection:
        self._resume_transaction()
        self._send_held()
        return self._raw

    @raw.setter
    def raw(self, conn: psycopg.Connection) -> None:
        self._held = []
        self._begin_later = self._savepoint_later = False
        self._doomed = None
        self._raw = conn

    def _send_held(self, then: str | None = None) -> None:
        held = [*self._held, then] if then is not None else self._held
        self._held = []
        if held:
            # One simple-protocol query (no parameters: several statements may go together).
            with self._raw.cursor() as cur:
                cur.execute("; ".join(held))

    def _run(self, cur: psycopg.Cursor, st: Statement, args: Sequence[Any]) -> PgCursor:
        cur.execute(st.sql, _params(args))
        rows = cur.fetchall() if _has_rows(cur) else []
        lastrowid = int(rows[0][0]) if st.returns_key and rows else None
        return PgCursor(rows, cur.rowcount, lastrowid)

    def solo(self, sql: str, args: Sequence[Any] = ()) -> PgCursor:
        """:meth:`execute` for a statement whose effect may stand alone even if the job fails
        after it (the ingest's append: a retried push is then answered as the duplicate it is).
        As a lone job's first statement it runs outside the transaction, committed when it
        returns (what the job runs after it, it runs in a transaction begun then); as the first
        statement of a later job of a group, without the job's savepoint (taken after it, if the
        job runs another statement)."""
        if self._raw.broken:
            return self.execute(sql, args)
        if self.lone and self._held == ["BEGIN"]:
            self._held = []
            self._in_transaction = False
            self._begin_later = True
            grouped = False
        elif self._in_transaction and self._held[-1:] == ["SAVEPOINT job"]:
            # A job after others in the group. The previous job's savepoint is left (released
            # with the transaction): ROLLBACK TO and RELEASE name the newest one.
            self._held.pop()
            if self._held[-1:] == ["RELEASE job"]:
                self._held.pop()
            grouped = True
        else:
            return self.execute(sql, args)
        st, _ = self._translate(sql)
        self._send_held()
        try:
            with self._raw.cursor() as cur:
                done = self._run(cur, st, args)
        except BaseException as exc:
            if grouped:
                # The transaction is aborted and no savepoint can restore it: the whole group
                # must fail (a COMMIT now would roll back what its jobs were told is stored).
                self._doomed = exc
            raise
        self._savepoint_later = grouped
        return done

    def _resume_transaction(self) -> None:
        """After a solo statement, the job's next statement opens the transaction, or takes
        the savepoint, the solo statement went without."""
        if self._begin_later:
            self._begin_later = False
            self._held.insert(0, "BEGIN")
            self._in_transaction = True
        if self._savepoint_later:
            self._savepoint_later = False
            self._held.append("SAVEPOINT job")

    def execute(self, sql: str, args: Sequence[Any] = ()) -> PgCursor:
        st, control = self._translate(sql)
        if self._begin_later:
            if control in ("end", "rollback") and not args:
                self._begin_later = False   # nothing ran in the transaction since: nothing to end
                self._held = []
                return _NO_ROWS
            self._resume_transaction()
        elif self._savepoint_later:
            if _JOB_SAVEPOINT_END.match(sql):
                # The job's savepoint was never taken: nothing to roll back to (the solo
                # statement's write may stay) or release; the writer's RELEASE ends it.
                self._savepoint_later = not sql.lstrip().upper().startswith("RELEASE")
                return _NO_ROWS
            if control in ("end", "rollback"):
                self._savepoint_later = False   # the transaction ends
            else:
                self._resume_transaction()      # the job's next statement: its savepoint first
        if self._doomed is not None:
            if control != "rollback":
                raise psycopg.errors.InFailedSqlTransaction(
                    f"the group's transaction failed in a statement without a savepoint: {self._doomed}")
            self._doomed = None
        if self._raw.broken and not self._in_transaction and self._reconnect is not None:
            # The server restarted or the network dropped: the group that saw it failed (and
            # was answered 503). Outside a transaction nothing is lost by a new connection;
            # inside one, the statement must fail (its transaction's earlier work is gone).
            log.warning("the store's writer connection broke; reconnecting")
            self.raw = self._reconnect()
        if st.transaction:
            self._in_transaction = st.transaction == "BEGIN"
        if control and not args:
            if control == "defer":
                self._held.append(st.sql)
            elif control == "rollback":
                # What is held is moot, and in an aborted transaction it would fail and keep the
                # ROLLBACK after it from running.
                self._held = []
                self._send_held(st.sql)
            else:
                self._send_held(st.sql)
            return _NO_ROWS
        self._send_held()
        with self._raw.cursor() as cur:
            return self._run(cur, st, args)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> PgCursor:
        st, _ = self._translate(sql)
        with self.raw.cursor() as cur:
            cur.executemany(st.sql.rsplit(" RETURNING ", 1)[0] if st.returns_key else st.sql,
                            [_params(r) for r in rows])
            return PgCursor([], cur.rowcount, None)

    def executescript(self, script: str) -> None:
        for sql in split_script(pg_ddl(script)):
            self.raw.execute(sql)

    def close(self) -> None:
        self._held = []
        self._begin_later = self._savepoint_later = False
        self._doomed = None
        self._raw.close()


class PooledReader:
    """``read_conn()`` of the PostgreSQL store: each statement borrows a pooled connection."""

    def __init__(self, pool: ConnectionPool, catalog: Catalog) -> None:
        self._pool = pool
        self.catalog = catalog
        self._translate = functools.lru_cache(maxsize=1024)(lambda sql: pg_statement(sql, catalog))

    def execute(self, sql: str, args: Sequence[Any] = ()) -> "PgCursor | StreamedRows":
        st = self._translate(sql)
        if _STREAMED.search(st.sql):
            return StreamedRows(self._pool, st.sql, _params(args))
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.execute(st.sql, _params(args))
            rows = cur.fetchall() if _has_rows(cur) else []
            if _big(rows):
                conn.close()      # the pool replaces it (see _big)
            return PgCursor(rows, cur.rowcount, None)


# libpq keeps its input buffer as large as the largest message the connection ever received
# (a row of a snapshot blob: its hex text, rounded up to a power of two) until the connection
# closes, in malloc memory Python does not see. Measured: one 8 MiB bytea row leaves 32 MiB in use
# on its connection; with 8 pooled connections each of which once read a large snapshot (a
# takeover, a release) that is the soak's replica growing in steps (docs/reliability.md). A
# connection that read a large row is closed instead of going back to the pool, which opens a
# fresh one: a reconnect per large read (restores are rare) for memory that stays bounded.
BIG_READ_BYTES = 1 << 20


def _big(rows: list) -> bool:
    return any(len(v) >= BIG_READ_BYTES for row in rows for v in row if isinstance(v, (bytes, str, memoryview)))


# Reads of chunk payloads (an export, a replay) can be the whole of a long run: they stream when
# iterated (``fetchall()`` reads them at once).
_STREAMED = re.compile(r"^\s*SELECT\b[^;]*\bpayload\b[^;]*\bFROM\s+chunks\b", re.IGNORECASE | re.DOTALL)


class StreamedRows:
    """The rows of a chunk read, fetched a few at a time through a server-side cursor while the
    caller iterates (an export holds a few chunks in memory, not the run). The pooled connection
    is held until the iteration ends or the iterator is dropped."""

    BATCH = 32

    def __init__(self, pool: ConnectionPool, sql: str, args: list[Any]) -> None:
        self._pool, self._sql, self._args = pool, sql, args

    def __iter__(self) -> Iterator[tuple]:
        with self._pool.connection() as conn, conn.transaction(), \
                conn.cursor(name="healthsvc_chunks") as cur:
            cur.itersize = self.BATCH
            cur.execute(self._sql, self._args)
            yield from cur

    def fetchall(self) -> list[tuple]:
        """All rows at once, the caller holds them anyway: one plain statement, where the
        cursor takes a transaction and a round trip per batch (``snapshots.chunks_by_id``)."""
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.execute(self._sql, self._args)
            rows = cur.fetchall()
            if _big(rows):
                conn.close()
            return rows

    def fetchone(self) -> tuple | None:
        return next(iter(self.fetchall()), None)


def load_catalog(conn: psycopg.Connection) -> Catalog:
    """Each table's columns, primary key and generated key, from ``information_schema``."""
    tables: dict[str, tuple[list[str], list[str], str | None]] = {}
    for table, column, identity in conn.execute(
            "SELECT table_name, column_name, is_identity FROM information_schema.columns"
            " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"):
        cols, pk, key = tables.setdefault(table, ([], [], None))
        cols.append(column)
        if identity == "YES":
            tables[table] = (cols, pk, column)
    for table, column in conn.execute(
            "SELECT tc.table_name, kcu.column_name FROM information_schema.table_constraints tc"
            " JOIN information_schema.key_column_usage kcu ON tc.constraint_name = kcu.constraint_name"
            " AND tc.table_schema = kcu.table_schema"
            " WHERE tc.constraint_type = 'PRIMARY KEY' AND tc.table_schema = current_schema()"
            " ORDER BY tc.table_name, kcu.ordinal_position"):
        tables[table][1].append(column)
    return Catalog({t: (tuple(c), tuple(p), k) for t, (c, p, k) in tables.items()})


# How long a read waits for a pooled connection, and a new connection for the server, seconds.
# Without a bound a read while the database is down waits the pool's 30 s and a connection to a
# host that does not answer forever: the client's request hangs instead of getting its 503.
READ_WAIT_S = 5.0
CONNECT_TIMEOUT_S = 5
# /readyz answers within a probe's usual timeout, whether the database is up, down or cut off
# (a network that stops answering leaves a statement waiting for minutes: the ping runs in a
# thread of its own and is given up on, one at a time).
PING_WAIT_S = 1.0
# A writer connection left inside an open transaction for longer than this is ended by the server.
# A replica cut off from the database mid-transaction (a network that stops answering, nothing
# closed) otherwise keeps its row locks until TCP gives up, hours later: the ``FOR SHARE`` of its
# fenced writes on a lease row, which another replica's takeover (``FOR UPDATE SKIP LOCKED``)
# then skips for as long (tests/faults/test_replica_cut_off.py saw it). Between two statements of
# one group commit the writer only encodes and binds; seconds there are already pathological.
IDLE_IN_TRANSACTION_S = 5.0
_BOUND_IDLE_IN_TRANSACTION = f"SET idle_in_transaction_session_timeout = {int(IDLE_IN_TRANSACTION_S * 1000)}"


class PgMetricsIngest(MetricsIngest):
    """The ingest on PostgreSQL: the usual push in one statement."""

    # The usual push in one statement (three statements otherwise): the read of a newer attempt
    # another replica opened, the claim of the batch's digest and the chunk's insert; both writes
    # happen only if there is no newer attempt (the batch then goes the general way, which claims
    # it), the chunk's only if the batch is new. (Data-modifying CTEs run once each, on the
    # statement's one snapshot.) A lone push runs it on its own (PgConnection.solo): one round trip.
    _APPEND_CURRENT = (
        "WITH newer AS (SELECT attempt, start_step FROM attempts WHERE run_id = ? AND attempt > ?"
        " ORDER BY attempt DESC LIMIT 1),"
        " claimed AS (INSERT INTO batches SELECT ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM newer)"
        " ON CONFLICT DO NOTHING RETURNING 1),"
        f" chunk AS (INSERT INTO chunks ({CHUNK_COLUMNS}) SELECT {CHUNK_PLACES}"
        " WHERE EXISTS (SELECT 1 FROM claimed) RETURNING id)"
        " SELECT EXISTS (SELECT 1 FROM claimed), (SELECT attempt FROM newer), (SELECT start_step FROM newer),"
        " (SELECT id FROM chunk)")

    def _append_current(self, conn: PgConnection, run_id: str, st: RunState, batch: MetricBatch, digest: str,
                        now: float, payload: bytes) -> Appended:
        claimed, newer, start, chunk_id = conn.solo(self._APPEND_CURRENT, (
            run_id, st.attempt, run_id, digest, len(batch), now,
            *chunk_row(run_id, st.attempt, batch, now, payload))).fetchone()
        if newer is not None:
            return Appended(newer=(int(newer), int(start)))
        if not claimed:
            return Appended(duplicate=True)
        return Appended(chunk_id=int(chunk_id))


class PostgresStore(StoreBase):
    sharing = SharedWriters()
    _ingest_class = PgMetricsIngest

    def __init__(self, uri: str, *, snapshot_every_s: float = 5.0, dedupe_window_s: float = 3600.0,
                 clock: Callable[[], float] = time.time, pool_size: int = 8, quotas: Quotas = Quotas()) -> None:
        super().__init__(snapshot_every_s=snapshot_every_s, dedupe_window_s=dedupe_window_s, clock=clock,
                         quotas=quotas)
        if not is_postgres_uri(uri):
            raise ValueError(f"not a PostgreSQL URI: {uri!r}")
        self.uri = uri
        self.path = redact(uri)
        self.pool_size = pool_size
        self.catalog = Catalog()
        self._pool: ConnectionPool | None = None
        self._reader: PooledReader | None = None
        self._token_watch: Any = None
        self._ping: Future | None = None
        self._ping_sent = 0.0

    def __repr__(self) -> str:
        return f"PostgresStore({self.path!r})"

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.uri, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        _configure(conn)
        conn.execute(_BOUND_IDLE_IN_TRANSACTION)
        return conn

    def _writer_connection(self) -> PgConnection:
        return PgConnection(self._connect(), self.catalog, reconnect=self._connect)

    def _migrate(self, conn: PgConnection) -> list[int]:
        raw = conn.raw
        # Migrations run their DDL and their own DML directly (no catalog yet). A data migration
        # may work in Python between its statements for as long as the data takes: no idle bound.
        raw.execute("SET idle_in_transaction_session_timeout = 0")
        try:
            applied = migrations.migrate(_Direct(raw), "postgresql", self.path, time.time(), ddl=pg_ddl,
                                         lock=f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        finally:
            raw.execute(_BOUND_IDLE_IN_TRANSACTION)
        self._refresh_catalog(raw)
        return applied

    def _refresh_catalog(self, raw: psycopg.Connection) -> None:
        self.catalog.tables = load_catalog(raw).tables

    def _run_script(self, conn: PgConnection, script: str) -> None:
        conn.executescript(script)
        self._refresh_catalog(conn.raw)

    def open(self) -> None:
        super().open()
        self._pool = ConnectionPool(self.uri, min_size=1, max_size=self.pool_size, open=True, timeout=READ_WAIT_S,
                                    kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
                                    configure=_configure, name="healthsvc-read")
        self._reader = PooledReader(self._pool, self.catalog)

    def _watch_tokens(self, on_change: Callable[[], None]) -> None:
        """Other replicas create and revoke tokens too: ``on_change`` runs when one does
        (:class:`~healthsvc.store.token_watch.TokenWatch`), until the store closes."""
        from healthsvc.store.token_watch import TokenWatch
        self._token_watch = TokenWatch(lambda: psycopg.connect(self.uri, autocommit=True), on_change).start()

    def _close_readers(self) -> None:
        if self._token_watch is not None:
            self._token_watch.stop()
            self._token_watch = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
            self._reader = None

    def ping(self) -> None:
        if self._pool is None:
            return super().ping()
        if self._ping is None or self._ping.done():   # the one before may still hang: no second
            self._ping, self._ping_sent = Future(), time.monotonic()
            # A daemon thread, not an executor's: a hung ping must not hold up the process's exit.
            threading.Thread(target=self._ping_once, args=(self._ping,), daemon=True, name="healthsvc-ping").start()
        try:
            self._ping.result(timeout=max(0.0, self._ping_sent + PING_WAIT_S - time.monotonic()))
        except FutureTimeout:
            raise psycopg.OperationalError(f"the database has not answered for {time.monotonic() - self._ping_sent:.1f} s") from None

    def _ping_once(self, done: Future) -> None:
        try:
            with self._pool.connection(timeout=PING_WAIT_S) as conn:
                conn.execute("SELECT 1").fetchone()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting ping
            done.set_exception(exc)
        else:
            done.set_result(None)

    def read_conn(self) -> PooledReader:
        if self._reader is None:
            # Before open() finished (run states are loaded on the writer's connection) or
            # after close(): read on a connection of one's own.
            return _Direct(self._connect(), self.catalog, owned=True)  # type: ignore[return-value]
        return self._reader

    def _check_fence(self, conn: PgConnection, fence: Any) -> None:
        from healthsvc.store.fencing import check_fence
        check_fence(conn.raw, fence)   # in the group commit's transaction, on its connection

    def check_schema(self) -> int:
        with psycopg.connect(self.uri, autocommit=True) as raw:
            return migrations.check_version(_Direct(raw), "postgresql", self.path)

    def size_bytes(self) -> int:
        return int(self.read_conn().execute("SELECT pg_database_size(current_database())").fetchone()[0])


class _Direct:
    """A raw connection running SQLite-dialect statements without a catalog (migrations, the
    version check): placeholders only."""

    def __init__(self, raw: psycopg.Connection, catalog: Catalog | None = None, owned: bool = False) -> None:
        self.raw, self.catalog, self.owned = raw, catalog or Catalog(), owned

    def execute(self, sql: str, args: Sequence[Any] = ()) -> PgCursor:
        st = pg_statement(sql, self.catalog) if self.catalog.tables else pg_plain(sql)
        try:
            with self.raw.cursor() as cur:
                cur.execute(st.sql, _params(args))
                rows = cur.fetchall() if _has_rows(cur) else []
                return PgCursor(rows, cur.rowcount, int(rows[0][0]) if st.returns_key and rows else None)
        finally:
            if self.owned:
                self.raw.close()
