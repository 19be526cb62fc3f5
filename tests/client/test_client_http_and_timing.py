"""The real HTTP transport against a stdlib server (keep-alive, gzip, NaN on the wire, errors), the
retry helpers, and the step timer."""
from __future__ import annotations

import email.utils
import gzip
import http.server
import json
import threading
import time

import pytest

from healthsvc_client.client import Run
from healthsvc_client.retry import Backoff, is_retryable_status, parse_retry_after_s
from healthsvc_client.timing import StepTimer
from healthsvc_client.transport import ConnectError, HTTPTransport, Request, RequestTimeout
from tests.client.conftest import wait_until


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            raw = gzip.decompress(raw)
        if self.path.endswith("/slow"):
            time.sleep(1.0)
        self.server.seen.append((self.client_address[1], self.path, raw))  # type: ignore[attr-defined]
        body = b'{"accepted": 1}'
        self.send_response(202)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_service():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_client_over_real_http_keeps_one_connection_and_sends_nan_tokens(http_service):
    url = f"http://127.0.0.1:{http_service.server_address[1]}"
    run = Run(url, "r", 0, flush_interval_s=0.01, heartbeat_interval_s=0, gzip_min_bytes=200)
    for step in range(3):
        run.log(loss=float("nan") if step == 1 else 1.0, step=step)
        assert run.flush(5.0)
    for step in range(3, 60):
        run.log(loss=1.0, grad_norm=2.0, step=step)
    assert run.finish(5.0)
    seen = http_service.seen
    metrics = [raw for _, path, raw in seen if path.endswith("/metrics")]
    assert len({port for port, _, _ in seen}) == 1  # keep-alive: one client port for all posts
    assert b'"loss":NaN' in metrics[1]
    assert sum(len(json.loads(raw)["records"]) for raw in metrics) == 60  # the gzipped one too
    assert seen[-1][1] == "/v1/runs/r/finish"


def test_http_transport_prefixes_a_base_path_and_reports_errors(http_service, unused_tcp_port):
    port = http_service.server_address[1]
    transport = HTTPTransport(f"http://127.0.0.1:{port}/health/")
    assert transport.request(Request("POST", "/v1/x", b"{}"), 5.0).status == 202
    assert http_service.seen[-1][1] == "/health/v1/x"
    with pytest.raises(RequestTimeout):
        transport.request(Request("POST", "/v1/slow", b"{}"), 0.2)
    with pytest.raises(ConnectError):
        HTTPTransport(f"http://127.0.0.1:{unused_tcp_port}").request(Request("POST", "/v1/x", b"{}"), 1.0)
    with pytest.raises(ValueError, match="http://host:port"):
        HTTPTransport("healthsvc:8000")


def test_real_http_heartbeats_while_metrics_upload_is_slow(http_service):
    # Separate connections per thread: a slow metrics post does not hold back the heartbeat.
    url = f"http://127.0.0.1:{http_service.server_address[1]}"
    run = Run(url, "r", 0, heartbeat_interval_s=0.05)
    assert wait_until(lambda: run.stats().heartbeats_sent >= 3)
    run.finish(2.0)


@pytest.mark.parametrize("status, retry", [(200, False), (400, False), (404, False), (408, True),
                                           (429, True), (500, True), (503, True), (599, True)])
def test_retryable_statuses(status, retry):
    assert is_retryable_status(status) is retry


def test_retry_after_parses_seconds_and_http_dates():
    assert parse_retry_after_s("2") == 2.0
    assert parse_retry_after_s("0.5") == 0.5
    assert parse_retry_after_s(None) is None and parse_retry_after_s("soon") is None
    now = 1_700_000_000.0
    assert parse_retry_after_s(email.utils.formatdate(now + 30, usegmt=True), now_s=now) == 30.0
    assert parse_retry_after_s(email.utils.formatdate(now - 30, usegmt=True), now_s=now) == 0.0


def test_backoff_grows_is_jittered_and_capped():
    import random

    backoff = Backoff(base_s=1.0, max_s=8.0, rng=random.Random(3))
    for attempt in range(8):
        ceiling = min(8.0, 2.0 ** attempt)
        delays = [backoff.delay_s(attempt) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1
    assert backoff.delay_s(0, retry_after="60") == 8.0  # a hint is capped too


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_step_timer_splits_a_step_into_data_compute_and_comm():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    timer.start_step(0)
    with timer.data():
        clock.now += 0.010
    with timer.compute():
        clock.now += 0.200
    with timer.comm():
        clock.now += 0.050
    with timer.compute():  # optimizer step: accumulates into compute_time
        clock.now += 0.030
    clock.now += 0.001     # untimed bookkeeping still counts in step_time
    times = timer.end_step()
    assert times == pytest.approx({"step_time": 0.291, "data_time": 0.010,
                                   "compute_time": 0.230, "comm_time": 0.050})
    timer.start_step(1)
    clock.now += 0.5
    assert timer.end_step() == pytest.approx({"step_time": 0.5, "data_time": 0.0,
                                              "compute_time": 0.0, "comm_time": 0.0})


def test_step_timer_drives_the_heartbeat_phase(make_run):
    run = make_run()
    timer = StepTimer(run=run)
    timer.start_step(7)
    seen = []
    with timer.data():
        seen.append(run._phase)
    with timer.compute():
        seen.append(run._phase)
    with timer.comm():
        seen.append((run._phase, run.step_in_progress))
    timer.end_step()
    assert seen == ["data", "compute", ("collective", 7)] and run._phase == "other"


class FakeCudaEvent:
    """Stands in for torch.cuda.Event: records the fake GPU clock (ms) when recorded."""

    gpu_ms = 0.0
    synced = 0

    def record(self) -> None:
        self.t = FakeCudaEvent.gpu_ms

    def synchronize(self) -> None:
        FakeCudaEvent.synced += 1

    def elapsed_time(self, other: FakeCudaEvent) -> float:
        return other.t - self.t


def test_step_timer_uses_device_events_when_given_an_event_factory():
    timer = StepTimer(event_factory=FakeCudaEvent)
    assert timer.uses_events
    timer.start_step()
    with timer.compute():
        FakeCudaEvent.gpu_ms += 120.0
    with timer.comm():
        FakeCudaEvent.gpu_ms += 30.0
    times = timer.end_step()
    assert times == pytest.approx({"step_time": 0.150, "data_time": 0.0,
                                   "compute_time": 0.120, "comm_time": 0.030})
    assert FakeCudaEvent.synced == 1  # one sync per step, at end_step
