"""The request guard: the outermost ASGI layer, in front of the ingest fast path and FastAPI.

In order, for every HTTP request:

1. ``Host`` must name the service (``healthsvc.auth.hosts``: the loopback names, the listen
   address, ``HEALTHSVC_ALLOWED_HOSTS``), else 400: a DNS-rebinding page says its own name;
2. a ``POST``, ``PUT`` or ``PATCH``, with a body or without, and a ``DELETE`` with a body must
   say ``Content-Type: application/json`` (``Content-Encoding: gzip`` allowed), else 415: a web
   page can send a form or ``text/plain`` POST to a service on localhost without any preflight,
   and an empty one (``POST .../finish``) changes state as well as a full one. (A page cannot
   send ``PUT``, ``PATCH`` or ``DELETE`` across origins without a preflight, which the service
   never grants; a body-less ``DELETE`` is therefore served as it is.)
3. the scope the route needs (``healthsvc.auth.scopes``) must be granted by the Bearer token:
   401 without a (valid) token, 403 with one lacking the scope, each naming the scope;
4. admin changes are written to the audit log with who, what, when and the answer's status;
5. a non-admin token is made the creator of the runs the request creates
   (``healthsvc.store.quotas.creator``), so ``max_runs_per_token`` holds it.

Until any token exists (no ``HEALTHSVC_ADMIN_TOKEN``, none created) the service is open: step 3 is
skipped, except that the first token created must carry ``admin`` (else nobody could administer
it afterwards). A rejected request's body is read and discarded before the answer, so a client
that sends the whole body before reading (Python's urllib) gets the answer, not a reset.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from healthsvc.auth.hosts import HostPolicy
from healthsvc.auth.scopes import grants, required_scope
from healthsvc.auth.tokens import TokenStore
from healthsvc.body_limit import answer_after_draining
from healthsvc.store.quotas import Creator, creator

log = logging.getLogger(__name__)

# Methods whose request must declare JSON even without a body (a cross-site form can send POST;
# PUT and PATCH always carry one here); DELETE must when it has a body.
_JSON_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _error(loc: list, msg: str, type_: str, hint: str | None = None) -> bytes:
    item = {"loc": loc, "msg": msg, "type": type_}
    if hint:
        item["hint"] = hint
    return orjson.dumps({"detail": [item]})


@dataclass(frozen=True)
class Admission:
    """A request's verdict at the guard: its rejection (status, JSON body, extra headers), or the
    scope it needs (None: any caller) and the token that granted it."""
    rejection: tuple[int, bytes, list] | None = None
    needed: str | None = None
    token: Any = None


class Guard:
    def __init__(self, app, tokens: TokenStore, *, hosts: HostPolicy, drain_limit: int = 1 << 30) -> None:
        self.app = app
        self.tokens = tokens
        self.hosts = hosts
        self.drain_limit = drain_limit

    def admission(self, method: str, path: str, headers) -> Admission:
        """Steps 1 to 3 for a request's method, path and (lower-case) headers: its rejection,
        or the scope it needs and the token that grants it (None while the service is open).
        The ASGI path above and the ingest protocol (``healthsvc.ingest.protocol``) both ask."""
        host = content_type = authorization = None
        has_body = False
        for name, value in headers:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-length":
                has_body = has_body or value.strip() not in (b"", b"0")
            elif name == b"transfer-encoding":
                has_body = True
        if not self.hosts.allows(host):
            return Admission(rejection=(400, _error(["header", "host"], f"host {host!r} is not served here",
                                                    "host_not_allowed", "add the name clients use to "
                                                    "HEALTHSVC_ALLOWED_HOSTS (comma-separated)"), []))
        if (method in _JSON_METHODS or (method == "DELETE" and has_body)) and content_type != "application/json":
            media = (content_type or "").split(";", 1)[0].strip().lower()   # parameters, case, spaces
            if media != "application/json":
                got = f"got {content_type!r}" if content_type else "got none"
                return Admission(rejection=(415, _error(
                    ["header", "content-type"], f"{method} requests must say Content-Type: application/json, even "
                    f"without a body ({got}): a web page can send any other", "unsupported_media_type",
                    "send Content-Type: application/json (Content-Encoding: gzip is accepted)"), []))
        needed, run_id = required_scope(method, path)
        token = None
        if needed is not None and self.tokens.enabled:
            presented = None
            if authorization and authorization[:7].lower() == "bearer ":
                presented = authorization[7:].strip()
            token = self.tokens.authenticate(presented) if presented else None
            if token is None:
                why = "a token is required" if not presented else "the token is not valid (unknown or revoked)"
                return Admission(rejection=(401, _error(
                    ["header", "authorization"], f"{why}: {method} {path} needs a token with scope {needed!r}",
                    "unauthorized", "send Authorization: Bearer <token> (HEALTHSVC_TOKEN for the client and CLI)"),
                    [(b"www-authenticate", f'Bearer scope="{needed}"'.encode())]))
            if not grants(token.scopes, needed):
                return Admission(rejection=(403, _error(
                    ["header", "authorization"], f"token {token.name!r} lacks scope {needed!r}, which {method} "
                    f"{path} needs (it has: {', '.join(sorted(token.scopes))})", "forbidden"), []))
            if needed == "ingest" and token.run_prefix and "admin" not in token.scopes \
                    and not (run_id or "").startswith(token.run_prefix):
                return Admission(rejection=(403, _error(
                    ["path", "run_id"], f"token {token.name!r} may push only to runs starting with "
                    f"{token.run_prefix!r}", "forbidden"), []))
        return Admission(needed=needed, token=token)

    @staticmethod
    def creator_of(token) -> Creator | None:
        """Step 5: whom the runs a request creates count against (not an admin: operators and
        replays are held by max_runs only)."""
        return Creator(token.id, token.name) if token is not None and "admin" not in token.scopes else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        verdict = self.admission(method, path, scope["headers"])
        if verdict.rejection is not None:
            status, body, extra = verdict.rejection
            return await answer_after_draining(receive, send, status, body, extra, self.drain_limit)
        needed, token = verdict.needed, verdict.token
        scope.setdefault("state", {})["token"] = token
        # The runs this request creates count against its token (not an admin's: operators and
        # replays are held by max_runs only); the store reads it with the write it queues.
        creator.set(self.creator_of(token))
        if needed != "admin" or method in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        status = 500
        actor = token.actor if token is not None else "anonymous (open service)"
        recorded = False

        async def record() -> None:
            nonlocal recorded
            recorded = True
            try:
                await asyncio.wrap_future(self.tokens.record(actor, method, path, status))
            except Exception:  # the store is closing or failing; the answer matters more than the log line
                log.exception("audit record of %s %s by %s failed", method, path, actor)

        async def recording_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                await record()   # in the log before the answer completes: a client reading it next sees it
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            if not recorded:
                await record()
