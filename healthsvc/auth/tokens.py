"""API tokens: stored hashed, cached in memory, created once and shown once.

A token is ``hs_`` + 32 random bytes (URL-safe base64). Only its SHA-256 is stored: tokens are
random and long, so a fast hash is enough (a slow password hash buys nothing against 256 bits of
entropy, and would cost every push). The bootstrap admin token (``HEALTHSVC_ADMIN_TOKEN``) is
never stored; it is compared by hash in memory like the others.

The cache is the database's: replicas over one PostgreSQL database hear each other's creations
and revocations (``store.tokens.watch``, ``LISTEN``/``NOTIFY``) and reload, so a token made or
revoked on one replica holds on every replica within milliseconds (a second at most).

Auth is *enabled* once there is a bootstrap token or any live token in the store; until then the
service is open (see ``healthsvc.auth.guard`` and docs/security.md). A service listening beyond
loopback (``exposed``) never becomes open again: the last live admin token cannot be revoked
there (:data:`LAST_ADMIN`; create another admin token first). Revoking the last token of all
would open it to anyone who can reach it (the check that refuses an open non-loopback listener
runs only at start-up), and revoking the last admin would leave nobody to manage the rest.
"""
from __future__ import annotations

import builtins
import hashlib
import hmac
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Callable

from healthsvc.store.tokens import TokenRow

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


# What :meth:`TokenStore.revoke` answers.
REVOKED, NOT_LIVE, LAST_ADMIN = "revoked", "not_live", "last_admin"


class TokenStore:
    def __init__(self, store, clock: Callable[[], float], admin_token: str = "", *, exposed: bool = False) -> None:
        """``exposed``: the service listens beyond loopback (the last admin token is kept)."""
        self.store = store
        self.clock = clock
        self.exposed = exposed
        self._bootstrap_hash = hash_token(admin_token) if admin_token else None
        self._by_hash: dict[str, Token] = {}
        self._lock = threading.Lock()
        self._writes = 0          # this process's changes to the cache (a reload racing one reads again)

    def load(self) -> None:
        """Read live tokens into memory (after the store opens), and again whenever another
        replica changes them."""
        self._reload()
        self.store.tokens.watch(self._reload)

    def _reload(self) -> None:
        for _ in range(3):
            seen = self._writes
            rows = self.store.tokens.live()
            fresh = {r.hash: Token(r.id, r.name, frozenset(r.scopes), r.run_prefix, r.created_at, r.created_by)
                     for r in rows}
            with self._lock:
                # A create or revoke of this process landed while we read: what we read may
                # predate it, so read again (else its own notification reloads once more).
                if self._writes == seen:
                    self._by_hash = fresh
                    return

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
        self.store.tokens.submit(TokenRow(tok.id, name, h, sorted(scopes), run_prefix, tok.created_at,
                                         created_by)).result(timeout=60)
        with self._lock:
            self._by_hash = {**self._by_hash, h: tok}
            self._writes += 1
        return secret, tok

    def revoke(self, token_id: str) -> str:
        """:data:`REVOKED`, :data:`NOT_LIVE` (no live token of that id), or :data:`LAST_ADMIN`
        (kept: it is the last admin token of an exposed service with no bootstrap token)."""
        keep_an_admin = self.exposed and self._bootstrap_hash is None
        outcome = self.store.tokens.submit_revocation(token_id, self.clock(),
                                                     keep_an_admin=keep_an_admin).result(timeout=60)
        if outcome == REVOKED:
            with self._lock:
                self._by_hash = {h: t for h, t in self._by_hash.items() if t.id != token_id}
                self._writes += 1
        return outcome

    def list(self) -> list[Token]:
        return [Token(r.id, r.name, frozenset(r.scopes), r.run_prefix, r.created_at, r.created_by, r.revoked_at)
                for r in self.store.tokens.all()]

    # -- audit ----------------------------------------------------------------------------------
    def record(self, actor: str, method: str, path: str, status: int):
        """Append to the audit log; returns the store's future (the guard awaits it, so an admin
        action is in the log by the time its answer is complete)."""
        now = self.clock()
        return self.store.audit.submit(now, actor, method, path, status)

    def audit(self, limit: int = 1000) -> builtins.list[dict[str, Any]]:   # `list` here is the method
        return [{"id": e.id, "at": e.at, "actor": e.actor, "method": e.method, "path": e.path, "status": e.status}
                for e in self.store.audit.newest(limit)]
