"""Offline mode end to end: the client spools to a file, `healthsvc sync` uploads it, and a
second sync does not duplicate anything."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.both_stores

import math
import subprocess
import sys

from healthsvc_client.client import Run


def test_offline_spool_then_sync(server, http, tmp_path):
    spool = tmp_path / "rank0.jsonl"
    run = Run(None, "offline-run", 0, mode="offline", spool_path=str(spool))
    for step in range(20):
        run.log(loss=float("nan") if step == 13 else 1.0 / (step + 1), step=step)
    run.checkpoint(10, "file:///ckpt/10", duration_s=1.5)
    run.finish()
    assert spool.exists()

    cmd = [sys.executable, "-m", "healthsvc", "sync", str(spool), "--url", server.url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "synced" in out.stdout and "[1/1]" in out.stdout

    cols = http.get("/v1/runs/offline-run/metrics").json()["columns"]
    assert cols["step"] == list(range(20))
    assert cols["loss"][13] == "NaN" and math.isclose(cols["loss"][1], 0.5)
    assert [c["step"] for c in http.get("/v1/runs/offline-run/checkpoints").json()] == [10]
    assert http.get("/v1/runs/offline-run").json()["status"] == "finished"

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert http.get("/v1/runs/offline-run/metrics").json()["columns"]["step"] == list(range(20))


def test_sync_reports_a_missing_file(tmp_path):
    out = subprocess.run([sys.executable, "-m", "healthsvc", "sync", str(tmp_path / "nope.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no such spool file" in out.stderr


def test_records_spooled_in_an_outage_and_synced_after_the_finish_fill_their_gap(server, http, tmp_path):
    # Online: the service is down while steps 10-14 are sent (given up on, kept in the spool);
    # it is back for 15-19 and the finish; `healthsvc sync` uploads 10-14 afterwards. The same
    # process sent every record: one attempt, every step, and the run stays finished.
    spool = tmp_path / "rank0.jsonl"
    run = Run(server.url, "outage", 0, spool_path=str(spool), max_attempts=1, timeout_s=2.0,
              heartbeat_interval_s=0, flush_interval_s=60)   # sent at the flushes only
    for step in range(10):
        run.log(loss=1.0, step=step)
    assert run.flush(timeout_s=30)
    server.kill()
    for step in range(10, 15):
        run.log(loss=2.0, step=step)
    assert run.flush(timeout_s=30) and (run.stats().spooled_requests, run.stats().failed_records) == (1, 5)
    server.start()
    for step in range(15, 20):
        run.log(loss=3.0, step=step)
    run.finish(timeout_s=30)   # False: the outage's request failed (it is in the spool)
    assert run.stats().pending == 0
    assert http.get("/v1/runs/outage").json()["status"] == "finished"

    out = subprocess.run([sys.executable, "-m", "healthsvc", "sync", str(spool), "--url", server.url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run_row = http.get("/v1/runs/outage").json()
    assert (run_row["attempt"], run_row["status"], run_row["last_step"]) == (1, "finished", 19)
    cols = http.get("/v1/runs/outage/metrics").json()["columns"]
    assert cols["step"] == list(range(20)) and len(set(cols["incarnation"])) == 1


def test_an_in_process_rollback_opens_a_new_attempt_and_is_sent_apart(server, http):
    # The loop reloads its checkpoint of step 4 without restarting the process and goes on
    # from step 5: the client's steps went back, so it draws a new incarnation, and the
    # records on either side of the rollback never share a body (step 5..7 of each branch kept).
    run = Run(server.url, "rewind", 0, heartbeat_interval_s=0, flush_interval_s=60)
    for step in range(8):
        run.log(loss=1.0, step=step)
    for step in range(5, 10):
        run.log(loss=2.0, step=step)
    assert run.finish(timeout_s=30)
    attempts = http.get("/v1/runs/rewind").json()["attempts"]
    assert [(a["attempt"], a["start_step"], a["last_step"]) for a in attempts] == [(1, 0, 7), (2, 5, 9)]
    first = http.get("/v1/runs/rewind/metrics", params={"attempt": 1}).json()["columns"]
    assert first["step"] == list(range(8)) and set(first["loss"]) == {1.0}
    eff = http.get("/v1/runs/rewind/metrics").json()["columns"]
    assert list(zip(eff["step"], eff["loss"])) == [(s, 1.0) for s in range(5)] + [(s, 2.0) for s in range(5, 10)]
