"""Every way the service can fail, and what the training thread sees: nothing (no block, no raise)."""
from __future__ import annotations

import threading
import time

from healthsvc_client.client import Run
from healthsvc_client.spool import read_spool
from healthsvc_client.transport import ConnectError, MockTransport, RequestTimeout, Response
from tests.client.conftest import wait_until

# Not a timing assertion: a log() that blocked on the transport would take the hang's full length
# (seconds); 10k non-blocking calls take milliseconds. The bound only separates the two.
NON_BLOCKING_BOUND_S = 2.0


def time_log_calls(run: Run, n: int = 10_000) -> float:
    start = time.perf_counter()
    for step in range(n):
        run.log(loss=1.0, grad_norm=0.5, step=step)
    return time.perf_counter() - start


def test_service_down_counts_failures_and_never_raises(make_run, service):
    service.script["metrics"] = [ConnectError("refused")] * 100
    run = make_run(max_attempts=3)
    for step in range(5):
        run.log(loss=1.0, step=step)
    run.flush(5.0)
    stats = run.stats()
    assert stats.failed_requests == 1 and stats.failed_records == 5
    assert stats.retries == 2 and stats.sent_records == 0
    assert "refused" in stats.last_error


def test_5xx_then_success_delivers_once_with_identical_bytes(make_run, service):
    service.script["metrics"] = [Response(500), Response(502), Response(503)]
    run = make_run()
    for step in range(3):
        run.log(loss=1.0, step=step)
    assert run.flush(5.0)
    attempts = service.requests("metrics")
    assert len(attempts) == 4
    assert len({a.body for a in attempts}) == 1  # retried byte for byte: same batch_id
    stats = run.stats()
    assert stats.retries == 3 and stats.sent_records == 3 and stats.failed_requests == 0


def test_429_retry_after_is_honoured(make_run, service):
    service.script["metrics"] = [Response(429, {"Retry-After": "0.3"})]
    run = make_run(backoff_base_s=0.001, backoff_max_s=5.0)
    run.log(loss=1.0, step=0)
    assert run.flush(5.0)
    (t0, _), (t1, _) = [a for a in service.arrivals if a[1].path.endswith("/metrics")]
    assert t1 - t0 >= 0.3  # without the header the backoff would wait ~1 ms
    assert run.stats().sent_records == 1


def test_timeouts_are_retried(make_run, service):
    service.script["metrics"] = [RequestTimeout("slow"), RequestTimeout("slow")]
    run = make_run()
    run.log(loss=1.0, step=0)
    assert run.flush(5.0)
    assert run.stats().retries == 2 and run.stats().sent_records == 1


def test_non_retryable_4xx_is_rejected_once_not_retried(make_run, service):
    service.script["metrics"] = [Response(422, {}, b'{"detail": "step must be >= 0"}')]
    run = make_run()
    run.log(loss=1.0, step=0)
    run.flush(5.0)
    assert len(service.requests("metrics")) == 1
    stats = run.stats()
    assert stats.rejected_requests == 1 and stats.retries == 0 and "422" in stats.last_error


def test_slow_responses_do_not_slow_log(make_run, service):
    service.hook = lambda request: time.sleep(0.2)
    run = make_run()
    assert time_log_calls(run) < NON_BLOCKING_BOUND_S
    assert run.flush(10.0)
    assert run.stats().sent_records == 10_000


def test_hung_transport_never_blocks_log_and_finish_honours_its_time_limit(make_run, service):
    release = threading.Event()
    service.hook = lambda request: release.wait(30)
    run = make_run()
    run.log(loss=1.0, step=0)
    assert wait_until(lambda: service.requests("metrics"))  # the sender is now stuck in the call
    assert time_log_calls(run) < NON_BLOCKING_BOUND_S
    start = time.monotonic()
    assert run.finish(timeout_s=0.5) is False
    assert time.monotonic() - start < 2.0
    assert run.stats().pending > 0
    release.set()


def test_full_queue_drops_the_oldest_and_counts(make_run, service):
    release = threading.Event()
    service.hook = lambda request: release.wait(30)
    run = make_run(max_queue=100, max_batch=1)
    run.log(loss=0.0, step=0)
    assert wait_until(lambda: service.requests("metrics"))  # step 0 is in flight, the queue is free
    for step in range(1, 1001):
        run.log(loss=float(step), step=step)
    assert run.stats().dropped == 900
    release.set()
    assert run.flush(10.0)
    steps = [r["step"] for r in service.records()]
    assert steps == [0] + list(range(901, 1001))  # the newest 100 survived, in order


def test_given_up_requests_go_to_the_spool_when_one_is_set(make_run, service, tmp_path):
    service.script["metrics"] = [ConnectError("down")] * 10
    spool = tmp_path / "fallback.jsonl"
    run = make_run(max_attempts=2, spool_path=spool)
    run.log(loss=float("nan"), step=4)
    run.flush(5.0)
    run.finish(1.0)
    ((method, path, body),) = [e for e in read_spool(spool) if e[1].endswith("/metrics")]
    assert (method, path) == ("POST", "/v1/runs/run-1/metrics")
    assert body["records"][0]["step"] == 4 and body["records"][0]["loss"] != body["records"][0]["loss"]
    assert run.stats().spooled_requests >= 1


def test_a_transport_that_raises_anything_is_treated_as_a_network_error(make_run, service):
    service.script["metrics"] = [KeyError("bug in a custom transport")]
    run = make_run()
    run.log(loss=1.0, step=0)
    assert run.flush(5.0)
    assert run.stats().sent_records == 1 and run.stats().retries == 1


def test_bad_arguments_to_log_are_counted_not_raised(make_run, service):
    run = make_run()
    run.log(["not", "a", "mapping"], step=0)
    run.log(loss=1.0, step="seven")
    run.log(loss=1.0, step=1)
    assert run.flush(5.0)
    assert [r["step"] for r in service.records()] == [1]
    assert run.stats().logged == 1 and run.stats().last_error


def test_failures_are_logged_once_per_kind(make_run, service, caplog):
    service.script["metrics"] = [ConnectError("down")] * 100
    run = make_run(max_attempts=2)
    for step in range(5):
        run.log(loss=1.0, step=step)
        run.flush(5.0)
    warnings = [r for r in caplog.records if r.name == "healthsvc.client"]
    assert len(warnings) == 1 and "down" in warnings[0].getMessage()
    assert run.stats().failed_requests == 5


def test_unreachable_port_over_real_http(unused_tcp_port):
    run = Run(f"http://127.0.0.1:{unused_tcp_port}", "r", 0, flush_interval_s=0.02,
              heartbeat_interval_s=0.05, max_attempts=2, backoff_base_s=0.001)
    assert time_log_calls(run, 1000) < NON_BLOCKING_BOUND_S
    run.flush(5.0)
    stats = run.stats()
    assert stats.failed_requests >= 1 and stats.sent_records == 0
    assert wait_until(lambda: run.stats().heartbeats_failed >= 1)
    run.finish(0.5)


def test_mock_transport_seam_is_used_instead_of_the_network():
    transport = MockTransport(lambda r: Response(202))
    run = Run("http://does-not-resolve.invalid", "r", 0, transport=transport, heartbeat_interval_s=0)
    run.log(loss=1.0, step=0)
    assert run.finish(2.0) and len(transport.requests) == 2
