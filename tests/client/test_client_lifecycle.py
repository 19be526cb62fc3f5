"""Heartbeats while the training thread is stuck, fork safety, the exit flush, offline spool + sync,
and the promise that importing the client imports nothing heavy."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from healthsvc_client.client import Run
from healthsvc_client.spool import SpoolWriter, read_spool
from healthsvc_client.sync import upload_spool
from healthsvc_client.transport import ConnectError, MockTransport, Response
from tests.client.conftest import wait_until

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout_s)


def test_heartbeat_reports_phase_and_step_while_training_thread_is_stuck(make_run, service):
    run = make_run(rank=3, heartbeat_interval_s=0.02)
    run.log(loss=1.0, step=41)
    stuck = threading.Event()
    release = threading.Event()

    def training_step() -> None:
        with run.phase("collective", step=42):
            stuck.set()
            release.wait(10)  # a peer never arrives at the all-reduce

    trainer = threading.Thread(target=training_step)
    trainer.start()
    stuck.wait(5)
    n_before = len(service.requests("heartbeats"))
    assert wait_until(lambda: len(service.requests("heartbeats")) >= n_before + 3)
    assert service.bodies("heartbeats")[-1] == {"rank": 3, "step": 42, "phase": "collective"}
    release.set()
    trainer.join()
    n_after = len(service.requests("heartbeats"))
    assert wait_until(lambda: len(service.requests("heartbeats")) > n_after)
    assert service.bodies("heartbeats")[-1]["phase"] == "other"  # restored on exit


def test_heartbeat_step_defaults_to_the_step_after_the_last_logged(make_run):
    run = make_run()
    assert run.step_in_progress == 0
    run.log(loss=1.0, step=9)
    assert run.step_in_progress == 10
    run.set_phase("data", step=12)
    assert run.step_in_progress == 12
    run.log(loss=1.0, step=12)
    assert run.step_in_progress == 13  # an explicit step behind the log is stale


def test_heartbeat_failures_are_counted(make_run, service):
    service.script["heartbeats"] = [ConnectError("down")] * 3
    run = make_run(heartbeat_interval_s=0.01)
    assert wait_until(lambda: run.stats().heartbeats_failed == 3 and run.stats().heartbeats_sent >= 1)


def test_heartbeat_stops_after_finish(make_run, service):
    run = make_run(heartbeat_interval_s=0.01)
    assert wait_until(lambda: len(service.requests("heartbeats")) >= 2)
    run.finish(1.0)
    # Barrier: the heartbeat thread has ended, so no heartbeat can follow the count below.
    assert wait_until(lambda: not run._heartbeat.is_alive())
    n = len(service.requests("heartbeats"))
    assert len(service.requests("heartbeats")) == n


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_a_disabled_client_and_parent_keeps_working(make_run, service):
    run = make_run(heartbeat_interval_s=0.01)
    run.log(loss=1.0, step=0)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what it sees through the pipe, then leave without atexit
        try:
            run.log(loss=2.0, step=1)
            run.checkpoint(1, "x")
            report = {"ignored": run.stats().ignored_calls, "pending": run.stats().pending,
                      "flush": run.flush(0.5), "finish": run.finish(0.5),
                      "threads": [t.name for t in threading.enumerate()]}
            os.write(write_fd, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        report = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert report["ignored"] == 2 and report["pending"] == 0
    assert report["flush"] is False and report["finish"] is False
    assert not [name for name in report["threads"] if name.startswith("healthsvc")]
    run.log(loss=3.0, step=2)
    assert run.flush(2.0)
    assert [r["step"] for r in service.records()] == [0, 2]


def test_exit_without_finish_flushes_within_its_time_limit(tmp_path):
    spool = tmp_path / "exit.jsonl"
    result = run_python(f"""
        import healthsvc_client
        healthsvc_client.init(run_id="r", rank=1, mode="offline", spool_path={str(spool)!r})
        for step in range(5):
            healthsvc_client.log(loss=float(step), step=step)
    """)
    assert result.returncode == 0, result.stderr
    entries = list(read_spool(spool))
    assert [r["step"] for _, _, body in entries for r in body["records"]] == [0, 1, 2, 3, 4]
    assert not [p for _, p, _ in entries if p.endswith("/finish")]  # an exit is not a finish


def test_exit_with_the_service_unreachable_is_bounded_by_exit_flush_timeout(unused_tcp_port):
    result = run_python(f"""
        import time, healthsvc_client
        healthsvc_client.init("http://127.0.0.1:{unused_tcp_port}", run_id="r", rank=0,
                     exit_flush_timeout_s=0.5, backoff_base_s=5.0, max_attempts=100)
        healthsvc_client.log(loss=1.0, step=0)
        deadline = time.monotonic() + 10
        while healthsvc_client.stats().last_error is None:   # barrier: the first attempt failed; the
            assert time.monotonic() < deadline       # sender now waits seconds to retry
            time.sleep(0.01)
        print(time.monotonic())
    """)
    assert result.returncode == 0, result.stderr
    # Not a timing figure: without the deadline the exit would wait ~100 retries of 5+ s.
    elapsed = time.monotonic() - float(result.stdout.strip())
    assert elapsed < 5.0


def test_offline_spool_then_sync_uploads_identical_bodies(tmp_path):
    spool = tmp_path / "offline.jsonl"
    run = Run(None, "exp", 2, mode="offline", spool_path=spool, flush_interval_s=0.01)
    run.log(loss=1.0, step=0)
    run.log(loss=float("nan"), step=1)
    run.checkpoint(1, "file:///c1")
    assert run.finish(2.0)
    assert "NaN" in spool.read_text()

    received = []
    transport = MockTransport(lambda r: received.append(r) or Response(202))
    result = upload_spool(spool, "http://unused", transport=transport)
    assert result == {"lines": 3, "sent": 3, "failed": 0, "rejected": 0, "bad_lines": [], "errors": []}
    assert [r.path.rsplit("/", 1)[-1] for r in received] == ["metrics", "checkpoints", "finish"]
    body = json.loads(received[0].body)
    assert [rec["step"] for rec in body["records"]] == [0, 1]
    assert math.isnan(body["records"][1]["loss"]) and b"NaN" in received[0].body
    spooled = next(read_spool(spool))[2]
    assert body["batch_id"] == spooled["batch_id"]  # a re-upload is deduplicated server-side


def test_sync_counts_failures_rejections_and_a_truncated_last_line(tmp_path):
    spool = tmp_path / "s.jsonl"
    with SpoolWriter(spool) as writer:
        for step in range(3):
            writer.write("POST", "/v1/runs/r/metrics", {"batch_id": str(step), "records": [{"step": step, "rank": 0}]})
    with open(spool, "a") as fh:
        fh.write('{"method": "POST", "path": "/v1/ru')  # the crash cut this line
    answers = iter([Response(202), Response(400, {}, b"bad"), ConnectError("down"), ConnectError("down")])

    def handler(request):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    result = upload_spool(spool, "http://unused", transport=MockTransport(handler),
                          max_attempts=2, sleep=lambda s: None)
    assert (result["lines"], result["sent"], result["rejected"], result["failed"]) == (3, 1, 1, 1)
    assert result["bad_lines"] == [4] and any("400" in e for e in result["errors"])


def test_importing_the_client_imports_nothing_heavy():
    result = run_python("""
        import sys
        import healthsvc_client, healthsvc_client.client, healthsvc_client.sync, healthsvc_client.timing, healthsvc_client.lightning, healthsvc_client.hf
        heavy = sorted(m for m in ("fastapi", "pandas", "numpy", "torch", "lightning",
                                   "transformers", "healthsvc", "healthsvc_detectors", "httpx", "pydantic")
                       if m in sys.modules)
        print(",".join(heavy))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
