"""API tokens: stored hashed, cached in memory, created once and shown once.

A token is ``hs_`` + 32 random bytes (URL-safe base64). Only its SHA-256 is stored: tokens are
random and long, so a fast hash is enough (a slow password hash buys nothing against 256 bits of
entropy, and would cost every push). The bootstrap admin token (``HEALTHSVC_ADMIN_TOKEN``) is
never stored; it is compared by hash in memory like the others.

Auth is *enabled* once there is a bootstrap token or any live token in the store; until then the
service is open (see ``healthsvc.auth.guard`` and the README's Security section).
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any, Callable

import orjson

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


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Token:
    id: str
    name: str
    scopes: frozenset[str]
    run_prefix: str | None = None
    created_at: float = 0.0
    created_by: str = ""
    revoked_at: float | None = None

    @property
    def actor(self) -> str:
        """Who, in the audit log."""
        return f"{self.name} ({self.id})"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "scopes": sorted(self.scopes), "run_prefix": self.run_prefix,
                "created_at": self.created_at, "created_by": self.created_by, "revoked_at": self.revoked_at}


BOOTSTRAP = Token(id="bootstrap", name="HEALTHSVC_ADMIN_TOKEN", scopes=frozenset({"admin"}))


class TokenStore:
    def __init__(self, store, clock: Callable[[], float], admin_token: str = "") -> None:
        self.store = store
        self.clock = clock
        self._bootstrap_hash = hash_token(admin_token) if admin_token else None
        self._by_hash: dict[str, Token] = {}
        self._lock = threading.Lock()
        store.register_schema(SCHEMA)

    def load(self) -> None:
        """Read live tokens into memory (after the store opens)."""
        rows = self.store.read_conn().execute(
            "SELECT id, name, hash, scopes, run_prefix, created_at, created_by FROM api_tokens WHERE revoked_at IS NULL")
        with self._lock:
            self._by_hash = {h: Token(i, n, frozenset(orjson.loads(s)), p, c, b) for i, n, h, s, p, c, b in rows}

    @property
    def enabled(self) -> bool:
        return self._bootstrap_hash is not None or bool(self._by_hash)

    def authenticate(self, presented: str) -> Token | None:
        h = hash_token(presented)
        if self._bootstrap_hash is not None and hmac.compare_digest(h, self._bootstrap_hash):
            return BOOTSTRAP
        # The lookup is by hash, so timing reveals nothing about the secret itself.
        return self._by_hash.get(h)

    def create(self, name: str, scopes: list[str], run_prefix: str | None, created_by: str) -> tuple[str, Token]:
        """A new token; its secret is returned only here."""
        secret = "hs_" + secrets.token_urlsafe(32)
        tok = Token(id="tok_" + secrets.token_hex(6), name=name, scopes=frozenset(scopes), run_prefix=run_prefix,
                    created_at=self.clock(), created_by=created_by)
        h = hash_token(secret)

        def job(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO api_tokens (id, name, hash, scopes, run_prefix, created_at, created_by)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?)", (tok.id, name, h, orjson.dumps(sorted(scopes)).decode(),
                                                           run_prefix, tok.created_at, created_by))
        self.store.write(job).result(timeout=60)
        with self._lock:
            self._by_hash = {**self._by_hash, h: tok}
        return secret, tok

    def revoke(self, token_id: str) -> bool:
        now = self.clock()
        changed = self.store.write(lambda conn: conn.execute(
            "UPDATE api_tokens SET revoked_at=? WHERE id=? AND revoked_at IS NULL", (now, token_id)).rowcount
        ).result(timeout=60)
        with self._lock:
            self._by_hash = {h: t for h, t in self._by_hash.items() if t.id != token_id}
        return bool(changed)

    def list(self) -> list[Token]:
        rows = self.store.read_conn().execute(
            "SELECT id, name, scopes, run_prefix, created_at, created_by, revoked_at FROM api_tokens ORDER BY created_at")
        return [Token(i, n, frozenset(orjson.loads(s)), p, c, b, r) for i, n, s, p, c, b, r in rows]

    # -- audit ----------------------------------------------------------------------------------
    def record(self, actor: str, method: str, path: str, status: int):
        """Append to the audit log; returns the store's future (the guard awaits it, so an admin
        action is in the log by the time its answer is complete)."""
        now = self.clock()
        return self.store.write(lambda conn: conn.execute(
            "INSERT INTO audit_log (at, actor, method, path, status) VALUES (?, ?, ?, ?, ?)",
            (now, actor, method, path[:500], status)))

    def audit(self, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self.store.read_conn().execute(
            "SELECT id, at, actor, method, path, status FROM audit_log ORDER BY id DESC LIMIT ?", (limit,))
        return [{"id": i, "at": a, "actor": who, "method": m, "path": p, "status": s} for i, a, who, m, p, s in rows]
