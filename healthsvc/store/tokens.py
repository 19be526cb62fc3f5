"""The API tokens table (only each token's SHA-256 is stored) and the audit log of admin actions:
the store's ``store.tokens`` and ``store.audit``.

Rows in, rows out: what a token *is* (scopes, the bootstrap token, hashing) is
:mod:`healthsvc.auth.tokens`'s.

Replicas share the table: a creation or revocation sends ``NOTIFY`` on :data:`CHANNEL` in its
own transaction (PostgreSQL delivers it at the commit), and every replica's watcher
(:mod:`healthsvc.store.token_watch`, the ``watch`` PostgreSQL's store gives the table) reloads the live tokens when it hears one. A revocation that
must keep an admin takes :data:`REVOCATION_LOCK` first, so two replicas revoking the last two
admin tokens at once cannot both succeed.
"""
from __future__ import annotations

import sqlite3
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from healthsvc.store.seam import TableAccess

CHANNEL = "hs_tokens"                 # NOTIFY channel of token changes (per database)
REVOCATION_LOCK = 0x68735f746f6b      # pg_advisory_xact_lock key: "hs_tok"

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_tokens (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    hash       TEXT NOT NULL UNIQUE,
    scopes     TEXT NOT NULL,
    run_prefix TEXT,
    created_at REAL NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at REAL
);
CREATE TABLE IF NOT EXISTS audit_log (
    id     INTEGER PRIMARY KEY,
    at     REAL NOT NULL,
    actor  TEXT NOT NULL,
    method TEXT NOT NULL,
    path   TEXT NOT NULL,
    status INTEGER NOT NULL
);
"""


@dataclass(frozen=True)
class TokenRow:
    id: str
    name: str
    hash: str | None              # None in listings (never shown back)
    scopes: list[str]
    run_prefix: str | None
    created_at: float             # unix seconds
    created_by: str
    revoked_at: float | None = None


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: float                     # unix seconds
    actor: str
    method: str
    path: str
    status: int


def _shared(conn: Any) -> bool:
    """Whether the connection is PostgreSQL's (other processes share the table)."""
    return getattr(conn, "dialect", "sqlite") == "postgresql"


def _announce(conn: Any) -> None:
    if _shared(conn):
        conn.execute(f"SELECT pg_notify('{CHANNEL}', '')")


def _has_admin(scopes: str) -> bool:
    return "admin" in orjson.loads(scopes)


# on_change -> None: call ``on_change()`` whenever another process may have changed the tokens.
TokenWatcher = Callable[[Callable[[], None]], None]


def _nothing_to_watch(on_change: Callable[[], None]) -> None:
    """One process holds a SQLite file, and its own changes go through it: nothing to watch."""


class TokensTable:
    """API tokens, the store's ``store.tokens``. ``watch``: how this store hears of other
    processes' changes (PostgreSQL's ``LISTEN``; none for SQLite)."""

    def __init__(self, db: TableAccess, watch: TokenWatcher = _nothing_to_watch) -> None:
        self._db = db
        self._watch = watch

    def watch(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change()`` whenever another process may have changed the tokens (until the
        store closes)."""
        self._watch(on_change)

    def live(self) -> list[TokenRow]:
        rows = self._db.read_conn().execute(
            "SELECT id, name, hash, scopes, run_prefix, created_at, created_by FROM api_tokens WHERE revoked_at IS NULL")
        return [TokenRow(i, n, h, orjson.loads(s), p, c, b) for i, n, h, s, p, c, b in rows]

    def all(self) -> list[TokenRow]:
        """Every token, revoked ones too, oldest first (without hashes)."""
        rows = self._db.read_conn().execute(
            "SELECT id, name, scopes, run_prefix, created_at, created_by, revoked_at FROM api_tokens ORDER BY created_at")
        return [TokenRow(i, n, None, orjson.loads(s), p, c, b, r) for i, n, s, p, c, b, r in rows]

    def submit(self, row: TokenRow) -> Future:
        def job(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO api_tokens (id, name, hash, scopes, run_prefix, created_at, created_by)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?)", (row.id, row.name, row.hash, orjson.dumps(sorted(row.scopes)).decode(),
                                                           row.run_prefix, row.created_at, row.created_by))
            _announce(conn)
        return self._db.write(job)

    def submit_revocation(self, token_id: str, now: float, *, keep_an_admin: bool = False) -> Future:
        """Resolves to ``"revoked"``, ``"not_live"`` (no live token of that id) or, with
        ``keep_an_admin``, ``"last_admin"`` when it is the only live admin token (then kept)."""
        def job(conn: Any) -> str:
            if keep_an_admin:
                if _shared(conn):
                    conn.execute("SELECT pg_advisory_xact_lock(?)", (REVOCATION_LOCK,))
                admins = [i for i, scopes in conn.execute(
                    "SELECT id, scopes FROM api_tokens WHERE revoked_at IS NULL") if _has_admin(scopes)]
                if admins == [token_id]:
                    return "last_admin"
            if conn.execute("UPDATE api_tokens SET revoked_at=? WHERE id=? AND revoked_at IS NULL",
                            (now, token_id)).rowcount == 0:
                return "not_live"
            _announce(conn)
            return "revoked"
        return self._db.write(job)


class AuditLog:
    """The audit log of admin actions, the store's ``store.audit``."""

    def __init__(self, db: TableAccess) -> None:
        self._db = db

    def submit(self, at: float, actor: str, method: str, path: str, status: int) -> Future:
        return self._db.write(lambda conn: conn.execute(
            "INSERT INTO audit_log (at, actor, method, path, status) VALUES (?, ?, ?, ?, ?)",
            (at, actor, method, path[:500], status)))

    def newest(self, limit: int = 1000) -> list[AuditEntry]:
        """The newest ``limit`` entries, newest first."""
        rows = self._db.read_conn().execute(
            "SELECT id, at, actor, method, path, status FROM audit_log ORDER BY id DESC LIMIT ?", (limit,))
        return [AuditEntry(*r) for r in rows]
