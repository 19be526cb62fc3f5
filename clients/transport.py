"""How the client's bytes reach the service: a one-method seam, a keep-alive HTTP implementation,
and a mock for tests (after ``httpx.MockTransport``).

Errors raised by a transport (everything else a transport raises is a bug in it)::

    TransportError            the request may not have reached the service; retrying is safe
    ├── ConnectError          connection refused / reset / DNS failure / closed mid-request
    └── RequestTimeout        no complete answer within ``timeout_s``

An HTTP error status is not an exception: it comes back as a ``Response`` and the caller decides
(see ``clients.retry``).

Example::

    >>> t = MockTransport(lambda req: Response(202, body=b'{"accepted": 1}'))
    >>> t.request(Request("POST", "/v1/runs/r/metrics", b"{}"), timeout_s=1.0).status
    202
"""
from __future__ import annotations

import http.client
import socket
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from clients.auth import auth_headers


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
    """

    def __init__(self, base_url: str) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(
                f"base_url must look like 'http://host:port', got {base_url!r}"
            )
        self.base_url = base_url.rstrip("/")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port
        self._prefix = parsed.path.rstrip("/")
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._all_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HTTPTransport({self.base_url!r})"

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=timeout_s)
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def request(self, request: Request, timeout_s: float) -> Response:
        conn = self._connection(timeout_s)
        headers = {"Connection": "keep-alive", **auth_headers(), **request.headers}
        try:
            conn.request(request.method, self._prefix + request.path, body=request.body or None,
                         headers=headers)
            raw = conn.getresponse()
            body = raw.read()
        except (socket.timeout, TimeoutError) as exc:
            self._drop_connection()
            raise RequestTimeout(f"{request.method} {request.path}: no answer in {timeout_s:g} s") from exc
        except (OSError, http.client.HTTPException) as exc:
            # A keep-alive connection the server closed shows up here; the caller retries.
            self._drop_connection()
            raise ConnectError(f"{request.method} {request.path}: {exc!r}") from exc
        if raw.will_close:
            self._drop_connection()
        return Response(raw.status, dict(raw.getheaders()), body)

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()


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
