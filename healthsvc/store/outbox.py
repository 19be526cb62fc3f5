"""The durable webhook outbox: every notification is a row before anyone tries to send it.

All of the alerting package's SQL lives here (in the store package, beside the store's own). Tables
(``outbox_tables``, created and upgraded by the store's ``migrations``, in the service's database
next to the store's own tables, SQLite or PostgreSQL):

- ``alert_outbox``: one row per (notification, subscription) delivery. ``webhook_id`` is fixed at
  enqueue time and sent on every attempt, so receivers can dedupe at-least-once delivery.
  ``state`` goes ``pending -> delivered | failed | dead`` (or ``cancelled`` when its subscription
  is deleted); ``failed`` is a non-retryable answer (a 4xx other than 429), ``dead`` a delivery
  that kept failing until its max age; both keep ``last_error``. ``claimed_until``: a worker
  holds the row until then (:meth:`Outbox.claim`), or until its attempt is recorded.
- ``alert_records``: small JSON records the alert manager must keep across restarts (alerts,
  silences, API subscriptions, the notification log), keyed by ``(kind, key)``.

Over the service store, every write is a job of the store's single writer (group commit); the
call returns once it is durable. A restart loses nothing: pending rows are read back and sent by
the next worker. A worker claims the rows it sends (``FOR UPDATE SKIP LOCKED`` on PostgreSQL), so
workers of several processes on one database are never handed the same row at once; a worker
that dies holding a claim leaves the row to the others once the claim runs out.

Example::

    >>> ob = Outbox(":memory:")
    >>> wid = ob.enqueue("oncall", "http://127.0.0.1:1/hook", "", b"{}", now=10.0)
    >>> [d.webhook_id for d in ob.due(now=10.0)] == [wid]
    True
"""
from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Protocol, Sequence, TypeVar

from healthsvc.encode import jsonable
from healthsvc.store import outbox_tables
from healthsvc.store.ops import Ops

T = TypeVar("T")



def new_webhook_id() -> str:
    """A delivery's id (the Standard Webhooks ``webhook-id``): the same on every retry, so a
    receiver that saw it already can drop the copy."""
    return "msg_" + secrets.token_hex(12)

class StoreLike(Protocol):
    """The part of the service store the outbox uses (see ``healthsvc.store.sqlite``)."""

    def write(self, job: Callable[[sqlite3.Connection], Any]) -> Any: ...
    def read_conn(self) -> sqlite3.Connection: ...
    def barrier(self) -> Future: ...


DeliveryState = Literal["pending", "delivered", "failed", "dead", "cancelled"]
DELIVERY_STATES: tuple[str, ...] = ("pending", "delivered", "failed", "dead", "cancelled")

SCHEMA = outbox_tables.SCHEMA   # the tables (version 1 of the schema)

_COLUMNS = ("seq", "webhook_id", "subscription_id", "url", "secret", "content_type", "body",
            "group_key", "reason", "state", "created_at", "next_attempt_at", "attempts",
            "last_attempt_at", "last_status", "last_error", "delivered_at")


@dataclass(frozen=True)
class Delivery:
    """One row of the outbox. Times are unix seconds."""

    seq: int
    webhook_id: str
    subscription_id: str
    url: str
    secret: str
    content_type: str
    body: bytes
    group_key: str
    reason: str
    state: DeliveryState
    created_at: float
    next_attempt_at: float
    attempts: int
    last_attempt_at: float | None
    last_status: int | None
    last_error: str | None
    delivered_at: float | None

    def to_dict(self) -> dict[str, Any]:
        """Status view for the API (no secret, no body)."""
        return {
            "webhook_id": self.webhook_id, "subscription_id": self.subscription_id,
            "group_key": self.group_key, "reason": self.reason, "state": self.state,
            "created_at": self.created_at, "next_attempt_at": self.next_attempt_at,
            "attempts": self.attempts, "last_attempt_at": self.last_attempt_at,
            "last_status": self.last_status, "last_error": self.last_error,
            "delivered_at": self.delivered_at,
        }


@dataclass(frozen=True)
class Attempt:
    """The outcome of one attempt to record (``state="pending"`` with ``next_attempt_at``: a
    retry); ``pull_forward``: the subscription whose waiting rows are made due now (its
    receiver just answered 2xx)."""

    webhook_id: str
    state: DeliveryState
    status: int | None
    error: str | None
    next_attempt_at: float | None = None
    pull_forward: str | None = None


class Outbox:
    """The outbox over one of:

    - a SQLite path (or ``":memory:"``): the outbox opens and owns its connection (tests, tools);
    - the service store (any object with ``write(job) -> Future`` running ``job(conn)`` in its
      single writer's transaction, and ``read_conn()``): every write goes through the store's
      writer. Its tables are created by the store's migrations (``healthsvc.store.migrations``);
      use it once the store is open.

    The alert manager's writes (records, enqueued deliveries) are made inside :meth:`collect`:
    they become :class:`Ops`, which its caller writes as one job (:meth:`submit_job`, or the
    findings job of the findings that caused them). The delivery worker's writes (claims,
    attempts) are jobs of their own, made at once.
    """

    def __init__(self, db: "str | Path | StoreLike") -> None:
        self._lock = threading.RLock()      # the own connection's statements and transactions
        self._collecting = threading.local()   # this thread's Ops (see collect)
        self._store: StoreLike | None = None
        self._conn: sqlite3.Connection | None = None
        if hasattr(db, "write") and hasattr(db, "read_conn"):
            self._store = db  # type: ignore[assignment]
            return   # the tables are the store's (its migrations create them)
        self._conn = sqlite3.connect(str(db), check_same_thread=False, timeout=30.0, isolation_level=None)
        if str(db) != ":memory:":
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=30000")
        from healthsvc.store import migrations   # (imports this module)
        migrations.migrate(self._conn, "sqlite", str(db), time.time())

    def close(self) -> None:
        if self._conn is not None:
            with self._lock:
                self._conn.close()

    @contextmanager
    def collect(self) -> Iterator[Ops]:
        """On this thread, until the block ends, the outbox's writes of alert state
        (:meth:`put_record`, :meth:`delete_record`, :meth:`enqueue`) and :meth:`after_commit`
        callbacks are collected into the yielded :class:`Ops` instead of run: the caller makes
        its change in memory and writes it as one job (``apply_ops`` in it; ``Ops.ended`` after)."""
        outer = getattr(self._collecting, "ops", None)
        ops = Ops()
        self._collecting.ops = ops
        try:
            yield ops
        finally:
            self._collecting.ops = outer

    def submit_job(self, job: Callable[[Any], T]) -> "Future[T]":
        """``job`` as one writer job, not waited for (a caller holding a lock submits under it,
        so jobs reach the writer in the order their changes were made); on the outbox's own
        connection, run at once."""
        if self._store is not None:
            return self._store.write(job)
        done: Future[T] = Future()
        try:
            with self._lock:
                self._execute("BEGIN IMMEDIATE")
                try:
                    value = job(self._conn)
                except BaseException:
                    self._execute("ROLLBACK")
                    raise
                self._execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 - handed to the future's reader
            done.set_exception(exc)
            return done
        done.set_result(value)
        return done

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        """Run ``callback(durable)`` once the job of this thread's collected writes ended
        (:meth:`collect`); outside a collection, now (``durable``: they were written at once)."""
        ops = getattr(self._collecting, "ops", None)
        if ops is None:
            callback(True)
        elif callback not in ops.after:
            ops.after.append(callback)

    def _change(self, sql: str, args: tuple) -> None:
        """A write of alert state: collected (:meth:`collect`), else one job now."""
        ops = getattr(self._collecting, "ops", None)
        if ops is not None:
            ops.statements.append((sql, args))
        else:
            self._write(lambda conn: conn.execute(sql, args))

    def _write(self, job: Callable[[sqlite3.Connection], T]) -> T:
        if self._store is not None:
            return self._store.write(job).result(timeout=60)
        return self.submit_job(job).result()

    def _execute(self, sql: str) -> None:
        with self._lock:
            assert self._conn is not None
            self._conn.execute(sql)

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        if self._store is not None:
            return self._store.read_conn().execute(sql, args).fetchall()
        with self._lock:
            assert self._conn is not None
            return self._conn.execute(sql, args).fetchall()

    # -- deliveries ---------------------------------------------------------------------------

    def enqueue(
        self, subscription_id: str, url: str, secret: str, body: bytes, now: float, *,
        group_key: str = "", reason: str = "", content_type: str = "application/json",
        webhook_id: str | None = None, claim_s: float | None = None,
    ) -> str:
        """Store a delivery, due at once; returns its ``webhook_id``. Durable when this returns.

        ``claim_s``: claimed at once for that long (see :meth:`claim`), by the worker this job
        hands it to once it is durable: the delivery needs no pass of its own to be claimed."""
        if webhook_id is None:
            webhook_id = new_webhook_id()
        claimed_until = None if claim_s is None else now + claim_s
        self._change(
            "INSERT INTO alert_outbox (webhook_id, subscription_id, url, secret, content_type,"
            " body, group_key, reason, state, created_at, next_attempt_at, claimed_until)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
            (webhook_id, subscription_id, url, secret, content_type, body, group_key, reason, now, now,
             claimed_until))
        return webhook_id

    def due(self, now: float, limit: int = 32, exclude: Iterable[str] = (),
            skip_subscriptions: Iterable[str] = ()) -> list[Delivery]:
        """Pending deliveries whose next attempt is due and that no worker holds a claim on,
        oldest first (none of ``exclude``, a set of webhook ids, nor of ``skip_subscriptions``)."""
        exclude, skip = set(exclude), sorted(set(skip_subscriptions))
        rows = self._read(
            f"SELECT {', '.join(_COLUMNS)} FROM alert_outbox WHERE state = 'pending'"
            " AND next_attempt_at <= ? AND (claimed_until IS NULL OR claimed_until <= ?)"
            f"{_not_in('subscription_id', skip)} ORDER BY next_attempt_at, seq LIMIT ?",
            (now, now, *skip, limit + len(exclude)))
        out = [_delivery(r) for r in rows]
        return [d for d in out if d.webhook_id not in exclude][:limit]

    def claim(self, now: float, limit: int = 32, hold_s: float = 60.0, exclude: Iterable[str] = (),
              skip_subscriptions: Iterable[str] = ()) -> list[Delivery]:
        """Claim up to ``limit`` due deliveries for ``hold_s`` seconds, oldest first: no other
        worker (of this process or another replica on the same PostgreSQL database) is handed
        them until the claim's attempt is recorded (:meth:`record_attempt` releases it) or the
        claim runs out (its worker died). On PostgreSQL concurrent claimers skip each other's
        rows (``FOR UPDATE SKIP LOCKED``); SQLite's single writer serialises them. Neither
        ``exclude`` (webhook ids) nor rows of ``skip_subscriptions`` are claimed."""
        rows = self._write(lambda conn: self._claim(conn, now, limit, hold_s, exclude, skip_subscriptions))
        return sorted((_delivery(r) for r in rows), key=lambda d: (d.next_attempt_at, d.seq))

    @staticmethod
    def _claim(conn: Any, now: float, limit: int, hold_s: float, exclude: Iterable[str],
               skip_subscriptions: Iterable[str]) -> list[tuple]:
        exclude, skip = sorted(set(exclude)), sorted(set(skip_subscriptions))
        lock = " FOR UPDATE SKIP LOCKED" if getattr(conn, "dialect", "sqlite") == "postgresql" else ""
        return conn.execute(
            f"UPDATE alert_outbox SET claimed_until = ? WHERE seq IN (SELECT seq FROM alert_outbox"
            f" WHERE state = 'pending' AND next_attempt_at <= ? AND (claimed_until IS NULL OR claimed_until <= ?)"
            f"{_not_in('webhook_id', exclude)}{_not_in('subscription_id', skip)}"
            f" ORDER BY next_attempt_at, seq LIMIT ?{lock}) RETURNING {', '.join(_COLUMNS)}",
            (now + hold_s, now, now, *exclude, *skip, limit)).fetchall()

    def record_and_claim(self, attempts: Sequence[Attempt], now: float, *, limit: int, hold_s: float,
                         busy: Callable[[], tuple[set[str], set[str]]],
                         claimed: Callable[[list[Delivery]], None]) -> list[Delivery]:
        """A delivery worker's pass as ONE job: record ``attempts`` (each as :meth:`record_attempt`,
        pulling its subscription's waiting rows forward when it was delivered), then claim up to
        ``limit`` due rows, one per subscription, none of ``busy()`` (webhook ids, subscriptions
        with an attempt in flight, as they are when the job runs: a row claimed by a job before
        this one counts). ``claimed(rows)`` is told in the job, so the next job sees them busy."""
        def job(conn: Any) -> list[Delivery]:
            for a in attempts:
                self._record_attempt(conn, a, now)
            exclude, skip = busy()
            got: list[Delivery] = []
            while len(got) < limit:
                rows = self._claim(conn, now, 1, hold_s, exclude, skip)
                if not rows:
                    break
                got.append(_delivery(rows[0]))
                skip.add(got[-1].subscription_id)
            claimed(got)
            return got
        return self._write(job)
    def next_due_at(self) -> float | None:
        """When the next unclaimed pending delivery falls due (a claimed one: when its claim ends)."""
        return self._read("SELECT MIN(CASE WHEN claimed_until > next_attempt_at THEN claimed_until"
                          " ELSE next_attempt_at END) FROM alert_outbox WHERE state = 'pending'")[0][0]

    def record_attempt(
        self, webhook_id: str, now: float, *, state: DeliveryState, status: int | None,
        error: str | None, next_attempt_at: float | None = None, pull_forward: str | None = None,
    ) -> int:
        """Write the outcome of one attempt (``state="pending"`` with ``next_attempt_at`` = retry).

        ``pull_forward``: a subscription whose receiver just answered 2xx; its other pending
        deliveries are made due now in the same job (one pass through the writer, not two).
        Returns how many were pulled forward."""
        attempt = Attempt(webhook_id, state, status, error, next_attempt_at, pull_forward)
        return self._write(lambda conn: self._record_attempt(conn, attempt, now))

    def _record_attempt(self, conn: Any, a: Attempt, now: float) -> int:
        conn.execute(
            "UPDATE alert_outbox SET state = ?, attempts = attempts + 1, last_attempt_at = ?, claimed_until = NULL,"
            " last_status = ?, last_error = ?, next_attempt_at = COALESCE(?, next_attempt_at),"
            " delivered_at = CASE WHEN ? = 'delivered' THEN ? ELSE delivered_at END"
            " WHERE webhook_id = ?",
            (a.state, now, a.status, a.error, a.next_attempt_at, a.state, now, a.webhook_id))
        return 0 if a.pull_forward is None else self._pull_forward(conn, a.pull_forward, now)

    def get(self, webhook_id: str) -> Delivery | None:
        rows = self._read(f"SELECT {', '.join(_COLUMNS)} FROM alert_outbox WHERE webhook_id = ?", (webhook_id,))
        return _delivery(rows[0]) if rows else None

    def deliveries(
        self, subscription_id: str | None = None, state: str | None = None, limit: int = 100,
    ) -> list[Delivery]:
        """Newest first; filter by subscription and/or state (``"dead"`` lists the dead letters)."""
        where, args = [], []
        if subscription_id is not None:
            where.append("subscription_id = ?")
            args.append(subscription_id)
        if state is not None:
            where.append("state = ?")
            args.append(state)
        sql = f"SELECT {', '.join(_COLUMNS)} FROM alert_outbox"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._read(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit))
        return [_delivery(r) for r in rows]

    def dead_letters(self, subscription_id: str | None = None, limit: int = 100) -> list[Delivery]:
        return self.deliveries(subscription_id, "dead", limit)

    def state_counts(self, subscription_id: str | None = None) -> dict[str, int]:
        """Deliveries per state, every state present (zero when none)."""
        sql = "SELECT state, COUNT(*) FROM alert_outbox"
        args: tuple = ()
        if subscription_id is not None:
            sql, args = sql + " WHERE subscription_id = ?", (subscription_id,)
        rows = self._read(sql + " GROUP BY state", args)
        counts = dict.fromkeys(DELIVERY_STATES, 0)
        counts.update({s: n for s, n in rows})
        return counts

    def pull_forward(self, subscription_id: str, now: float) -> int:
        """Make a subscription's pending deliveries due now (its receiver just answered 2xx)."""
        return self._write(lambda conn: self._pull_forward(conn, subscription_id, now))

    @staticmethod
    def _pull_forward(conn: Any, subscription_id: str, now: float) -> int:
        return conn.execute(
            "UPDATE alert_outbox SET next_attempt_at = ? WHERE subscription_id = ? AND state = 'pending'"
            " AND next_attempt_at > ?", (now, subscription_id, now)).rowcount

    @staticmethod
    def cancel_pending(conn: Any, subscription_id: str, now: float) -> int:
        """Stop delivering to a deleted subscription, inside the caller's job (with the change
        that deleted it); returns how many were cancelled."""
        return int(conn.execute(
            "UPDATE alert_outbox SET state = 'cancelled', last_error = 'subscription deleted',"
            " last_attempt_at = COALESCE(last_attempt_at, ?)"
            " WHERE subscription_id = ? AND state = 'pending'", (now, subscription_id)).rowcount)

    def redeliver(self, webhook_id: str, now: float) -> bool:
        """Put a dead or failed delivery back in the queue (same ``webhook_id``, fresh max age)."""
        return self._write(lambda conn: conn.execute(
            "UPDATE alert_outbox SET state = 'pending', next_attempt_at = ?, created_at = ?"
            " WHERE webhook_id = ? AND state IN ('dead', 'failed')", (now, now, webhook_id)).rowcount) == 1

    # -- records ------------------------------------------------------------------------------

    def put_record(self, kind: str, key: str, value: dict[str, Any], now: float) -> None:
        text = json.dumps(jsonable(value), allow_nan=False)
        self._change(
            "INSERT INTO alert_records (kind, key, value, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (kind, key, text, now))

    def delete_record(self, kind: str, key: str) -> None:
        self._change("DELETE FROM alert_records WHERE kind = ? AND key = ?", (kind, key))

    def records(self, kind: str) -> dict[str, dict[str, Any]]:
        """The records of one kind, as committed (a caller that must see its own submitted
        changes waits for them first: :meth:`settled`)."""
        rows = self._read("SELECT key, value FROM alert_records WHERE kind = ? ORDER BY key", (kind,))
        return {k: json.loads(v) for k, v in rows}

    def settled(self, timeout_s: float = 60.0) -> None:
        """Return once every job submitted before this call is durable (a reload reads them)."""
        if self._store is not None:
            self._store.barrier().result(timeout=timeout_s)


def _delivery(row: tuple) -> Delivery:
    d = dict(zip(_COLUMNS, row))
    d["body"] = bytes(d["body"])
    return Delivery(**d)


def _not_in(column: str, values: list[str]) -> str:
    """An ``AND column NOT IN (?, ...)`` clause for ``values`` (nothing when there are none)."""
    return f" AND {column} NOT IN ({', '.join('?' * len(values))})" if values else ""
