"""Shared helpers for the client tests: a scripted fake service behind ``MockTransport``."""
from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Callable

import pytest

from healthsvc_client.client import Run
from healthsvc_client.transport import MockTransport, Request, Response


def decode_body(request: Request) -> dict:
    """The JSON body of a request, gunzipped if needed; NaN tokens parse to float('nan')."""
    data = request.body
    if request.headers.get("Content-Encoding") == "gzip":
        data = gzip.decompress(data)
    return json.loads(data)


class FakeService:
    """Answers from a script of responses/exceptions per endpoint suffix, then 202.

    ``script["metrics"] = [Response(503), ConnectError("down")]`` makes the first two metrics posts
    fail. Every request is kept with its arrival time (monotonic seconds).
    """

    def __init__(self) -> None:
        self.script: dict[str, list] = {}
        self.arrivals: list[tuple[float, Request]] = []
        self.lock = threading.Lock()
        self.hook: Callable[[Request], None] | None = None

    def __call__(self, request: Request) -> Response:
        endpoint = request.path.rsplit("/", 1)[-1]
        with self.lock:
            self.arrivals.append((time.monotonic(), request))
            queue = self.script.get(endpoint)
            step = queue.pop(0) if queue else None
        if self.hook is not None:
            self.hook(request)
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, Response):
            return step
        return Response(202, {}, b'{"accepted": 1}')

    def requests(self, endpoint: str) -> list[Request]:
        with self.lock:
            return [r for _, r in self.arrivals if r.path.endswith("/" + endpoint)]

    def bodies(self, endpoint: str) -> list[dict]:
        return [decode_body(r) for r in self.requests(endpoint)]

    def records(self) -> list[dict]:
        return [rec for body in self.bodies("metrics") for rec in body.get("records", [])]


@pytest.fixture
def service() -> FakeService:
    return FakeService()


@pytest.fixture
def make_run(service: FakeService):
    """Factory for a Run wired to the fake service, with fast timings; finished at teardown."""
    runs: list[Run] = []

    def make(**options) -> Run:
        options.setdefault("transport", MockTransport(service))
        options.setdefault("flush_interval_s", 0.02)
        options.setdefault("heartbeat_interval_s", 0)
        options.setdefault("backoff_base_s", 0.001)
        options.setdefault("backoff_max_s", 0.05)
        run = Run(options.pop("url", "http://fake"), options.pop("run_id", "run-1"),
                  options.pop("rank", 0), **options)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.finish(timeout_s=1.0)


@pytest.fixture
def unused_tcp_port() -> int:
    """A local port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Poll ``predicate`` until true or ``timeout_s``; returns its last value."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()
