"""How the client's bytes reach the service: a one-method seam, a keep-alive HTTP implementation,
and a mock for tests (after ``httpx.MockTransport``).

Errors raised by a transport (everything else a transport raises is a bug in it)::

    TransportError            the request may not have reached the service; retrying is safe
    ├── ConnectError          connection refused / reset / DNS failure / closed mid-request
    └── RequestTimeout        no complete answer within ``timeout_s``

An HTTP error status is not an exception: it comes back as a ``Response`` and the caller decides
(see ``healthsvc_client.retry``).

Example::

    >>> t = MockTransport(lambda req: Response(202, body=b'{"accepted": 1}'))
    >>> t.request(Request("POST", "/v1/runs/r/metrics", b"{}"), timeout_s=1.0).status
    202
"""
from __future__ import annotations

import http.client
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol



class TransportError(Exception):
    """The request may not have reached the service (safe to retry: bodies carry a batch_id)."""


class ConnectError(TransportError):
    """Could not connect, or the connection broke before a full response arrived."""


class RequestTimeout(TransportError):
    """No complete response within the request's ``timeout_s``."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # absolute path including the /v1 prefix and any query string
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """Case-insensitive header lookup."""
        lname = name.lower()
        for key, value in self.headers.items():
            if key.lower() == lname:
                return value
        return None


class Transport(Protocol):
    """Sends one request. Must be safe to call from several threads at once."""

    def request(self, request: Request, timeout_s: float) -> Response: ...

    def close(self) -> None: ...


class HTTPTransport:
    """Keep-alive HTTP/1.1 over ``http.client``, one connection per calling thread.

    http.client connections are not thread-safe, and the client calls from its sender thread, its
    heartbeat thread and the caller's thread (``rollback_target``): each gets its own connection,
    so a slow metrics upload never delays a heartbeat.

    Idle keep-alive connections: a server closes a connection idle past its keep-alive timeout
    (uvicorn: 5 s), and a request written into it at about that moment fails although nothing is
    wrong (with 5 s heartbeats that was most of them). So a connection idle for ``idle_timeout_s``
    (default 4 s, below uvicorn's) is replaced before use, and a request on a reused connection
    that breaks before any answer arrives (reset, broken pipe, closed without a status line) is
    sent once more on a fresh one. Retrying is safe: metrics carry a ``batch_id``, heartbeats are
    idempotent. A timeout is not retried here (the service may be busy with it).

    ``token`` (default env ``HEALTHSVC_TOKEN``) is sent as ``Authorization: Bearer <token>``.
    """

    def __init__(self, base_url: str, *, idle_timeout_s: float = 4.0, token: str | None = None) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(
                f"base_url must look like 'http://host:port', got {base_url!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.idle_timeout_s = idle_timeout_s
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port
        self._prefix = parsed.path.rstrip("/")
        token = os.environ.get("HEALTHSVC_TOKEN", "") if token is None else token
        self._auth = {"Authorization": f"Bearer {token.strip()}"} if token.strip() else {}
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._all_lock = threading.Lock()
        self.reconnects = 0  # requests re-sent on a fresh connection after a stale one broke

    def __repr__(self) -> str:
        return f"HTTPTransport({self.base_url!r})"

    def _connection(self, timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection and whether it is an open, reused one."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None and (
                time.monotonic() - self._local.last_used > self.idle_timeout_s):
            self._drop_connection()  # the server may be closing it right now
            conn = None
        if conn is None:
            cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=timeout_s)
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn, conn.sock is not None

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
            with self._all_lock:
                if conn in self._all:
                    self._all.remove(conn)

    def request(self, request: Request, timeout_s: float) -> Response:
        headers = {"Connection": "keep-alive", **self._auth, **request.headers}
        while True:
            conn, reused = self._connection(timeout_s)
            try:
                conn.request(request.method, self._prefix + request.path, body=request.body or None,
                             headers=headers)
                raw = conn.getresponse()
                body = raw.read()
            except (socket.timeout, TimeoutError) as exc:
                self._drop_connection()
                raise RequestTimeout(f"{request.method} {request.path}: no answer in {timeout_s:g} s") from exc
            except _STALE_ERRORS as exc:
                self._drop_connection()
                if reused:  # the server closed the idle connection under us: once more, fresh
                    self.reconnects += 1
                    continue
                raise ConnectError(f"{request.method} {request.path}: {exc!r}") from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                raise ConnectError(f"{request.method} {request.path}: {exc!r}") from exc
            self._local.last_used = time.monotonic()
            if raw.will_close:
                self._drop_connection()
            return Response(raw.status, dict(raw.getheaders()), body)

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()


# What a keep-alive connection the server already closed looks like when it is written to or read.
_STALE_ERRORS = (http.client.RemoteDisconnected, http.client.BadStatusLine, BrokenPipeError,
                 ConnectionResetError, ConnectionAbortedError)


Handler = Callable[[Request], Response]


class MockTransport:
    """Answers every request with ``handler(request)``; no network.

    The handler may raise ``ConnectError``/``RequestTimeout`` to simulate a down or slow service, or
    block to simulate a hung one. Every request is kept in ``requests`` (thread-safe append).
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MockTransport({len(self.requests)} requests)"

    def request(self, request: Request, timeout_s: float) -> Response:
        with self._lock:
            self.requests.append(request)
        return self.handler(request)

    def close(self) -> None:
        pass
