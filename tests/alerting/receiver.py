"""A tiny webhook receiver on 127.0.0.1 that fails on cue, for delivery tests.

``script`` is consumed one entry per request: ``("status", code)``, ``("status", code, headers)``
or ``("sleep", seconds)`` (answers 200 after sleeping, so a client with a shorter timeout gives
up). When the script is empty every request gets 200. Every request is recorded.
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.barriers import wait_until


@dataclass(frozen=True)
class Received:
    at: float
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int


def free_port() -> int:
    """A port nobody listens on (yet): connecting to it is refused until a Receiver takes it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
    def __init__(self, port: int = 0, script: list[tuple] | None = None) -> None:
        self.script = list(script or [])
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with outer._lock:
                    action = outer.script.pop(0) if outer.script else ("status", 200)
                code, headers = 200, {}
                if action[0] == "sleep":
                    time.sleep(action[1])
                else:
                    code = action[1]
                    headers = action[2] if len(action) > 2 else {}
                with outer._lock:
                    outer.requests.append(Received(time.time(), self.path, {k.lower(): v for k, v in self.headers.items()},
                                                   body, code))
                try:
                    self.send_response(code)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the client gave up (timeout test)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "Receiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def delivered(self) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if 200 <= r.answered < 300]

    def wait_for(self, n_delivered: int, timeout_s: float = 10.0) -> list[Received]:
        """A barrier for a sender the test cannot drain (a worker on the real clock, another
        process): at least ``n_delivered`` deliveries."""
        def enough() -> list[Received] | None:
            got = self.delivered()
            return got if len(got) >= n_delivered else None
        try:
            return wait_until(enough, timeout_s=timeout_s, interval_s=0.01, what=f"{n_delivered} deliveries")
        except AssertionError:
            raise AssertionError(f"receiver got {len(self.delivered())} deliveries, wanted {n_delivered}: "
                                 f"{self.requests}") from None
