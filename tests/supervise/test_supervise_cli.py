"""``healthsvc supervise`` against a real server (uvicorn on 127.0.0.1, real time) with a real job:
tests/supervise/job.py, two ranks pushing with the client, checkpointing every 10 steps, reading
``--resume``. The supervisor and the job are real processes; the tests wait on their exit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_process import free_port

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("job.py")


def supervise(url: str, run_id: str, tmp_path: Path, *job_args: str, timeout_s: float = 120.0,
              sup_args: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the supervisor over the job; returns its result and the job's starts (its --log)."""
    log = tmp_path / f"{run_id}.starts.jsonl"
    job = [sys.executable, str(JOB), "--url", url, "--run-id", run_id, "--ckpt-dir",
           str(tmp_path / f"ckpt-{run_id}"), "--log", str(log), "--resume", "{checkpoint}",
           "--exclude", "{exclude_hosts}", "--world-size", "{world_size}", *job_args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HEALTHSVC_URL", None)
    result = subprocess.run([sys.executable, "-m", "healthsvc", "supervise", "--run-id", run_id,
                             "--url", url, "--poll-s", "0.3", "--grace-s", "5", *sup_args, "--", *job],
                            capture_output=True, text=True, timeout=timeout_s, env=env, cwd=tmp_path,
                            check=False)
    starts = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, starts


def progress(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("healthsvc supervise:")]


def supervised_events(http, run_id: str) -> list[dict]:
    return [e for e in http.get(f"/v1/runs/{run_id}/events").json()
            if (e["data"] or {}).get("decided_by") == "healthsvc supervise"]


def test_nan_restarts_from_the_newest_clean_checkpoint_and_the_run_finishes_healthy(
        shared_server, shared_http, tmp_path):
    run_id = "sup-nan"
    result, starts = supervise(shared_server.url, run_id, tmp_path, "--steps", "300", "--step-s",
                               "0.03", "--nan-at", "30")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(starts) == 2 and starts[0]["resume"] == "", starts
    [event] = supervised_events(shared_http, run_id)
    assert event["kind"] == "rollback" and event["step"] < 30 and event["attempt"] == 1
    assert starts[1]["resume"].endswith(f"/step{event['step']}.json")
    assert (starts[1]["exclude"], starts[1]["world_size"]) == ("", "2")
    nan = [f for f in shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "non_finite"}).json()
           if f["id"] in event["data"]["finding_ids"]]
    assert nan and min(f["step"] for f in nan) == 30 and nan[0]["ranks"] == [1]
    # Within 10 s of the finding (both times are the service's clock).
    assert event["ts"] - min(f["created_at"] for f in nan) < 10.0
    # The rollback answer's checkpoint: before the first corrupted update (30), with the one
    # checkpoint of margin a findings-dated onset takes (docs/rollback.md).
    assert event["step"] in (19, 29)
    shared_http.drain()
    run = shared_http.get(f"/v1/runs/{run_id}").json()
    assert (run["status"], run["attempt"], run["last_step"]) == ("finished", 2, 299), run
    assert shared_http.get(f"/v1/runs/{run_id}/action").json()["action"] == "continue"
    lines = progress(result)
    [restart] = [line for line in lines if "restart 1/3" in line]
    assert f"from step {event['step']}" in restart and "non_finite (critical) at step 30." in restart
    assert restart.endswith(starts[1]["resume"]) and restart.count("at step 30") == 1
    assert lines[-1].endswith("the job finished (exit status 0)")


def test_a_resume_mismatch_after_the_restart_stops_with_the_reason(shared_server, shared_http, tmp_path):
    run_id = "sup-resume"
    result, starts = supervise(shared_server.url, run_id, tmp_path, "--steps", "300", "--step-s",
                               "0.03", "--nan-at", "30", "--reset-data-on-resume")
    assert result.returncode == 3, result.stderr[-3000:]
    assert len(starts) == 2                                   # one restart, then no loop
    [stopped] = [line for line in progress(result) if "supervise: stopped (" in line]
    assert "stopped (resume_mismatch): A resume_mismatch at step" in stopped and "restore" in stopped
    assert sum("A resume_mismatch at step" in line for line in progress(result)) == 1   # said once
    with pytest.raises(ProcessLookupError):                   # the job is gone
        os.kill(starts[1]["pid"], 0)
    shared_http.drain()
    mismatch = shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "resume_mismatch"}).json()
    assert mismatch and mismatch[0]["attempt"] == 2


@pytest.mark.parametrize("check,left_out", [("false", True), ("true", False)])
def test_a_hung_rank_restarts_without_its_host_unless_it_passes_the_health_check(
        shared_server, shared_http, tmp_path, check, left_out):
    run_id = f"sup-hang-{check}"
    r = shared_http.put(f"/v1/runs/{run_id}", json={"detectors": {"hang": {"timeout_floor_s": 1.0}}})
    assert r.status_code == 200, r.text
    result, starts = supervise(shared_server.url, run_id, tmp_path, "--steps", "200", "--step-s",
                               "0.03", "--hang-at", "30", sup_args=("--health-check", check + " {host}"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(starts) == 2
    assert (starts[1]["exclude"], starts[1]["world_size"]) == (("node-b", "1") if left_out else ("", "2"))
    events = supervised_events(shared_http, run_id)
    assert [e["data"]["exclude_hosts"] for e in events] == [["node-b"] if left_out else []]
    assert events[0]["data"]["causes"][0][0] == "hang"
    # The restarted job started within 10 s of the hang's detection: the hang's detection time
    # plus 10 s after it began (both clocks are this machine's: the server runs in real time).
    hangs = [f for f in shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "hang"}).json()
             if f["id"] in events[0]["data"]["finding_ids"]]
    assert hangs and starts[1]["at"] - min(f["created_at"] for f in hangs) < 10.0
    changes = [e["data"] for e in shared_http.get(f"/v1/runs/{run_id}/events").json()
               if e["kind"] == "world_size_change"]
    assert [(c["old"], c["new"]) for c in changes] == ([(2, 1)] if left_out else [])
    verdict = "failed: it stays out" if left_out else "passed: it is taken back"
    assert any(f"health check of node-b {verdict}" in line for line in progress(result))


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(shared_server, shared_http, tmp_path):
    run_id = "sup-sigkill"
    result, starts = supervise(shared_server.url, run_id, tmp_path, "--steps", "400", "--step-s",
                               "0.03", "--nan-at", "30", "--ignore-sigterm",
                               sup_args=("--grace-s", "1"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(starts) == 2 and len(supervised_events(shared_http, run_id)) == 1
    # Left alone the first job would run 400 x 30 ms = 12 s; it was restarted well before that:
    # about a second to the NaN, one to decide, the one-second grace, then SIGKILL.
    assert starts[1]["at"] - starts[0]["at"] < 8.0, starts
    with pytest.raises(ProcessLookupError):    # SIGKILL after the grace: the first job is gone
        os.kill(starts[0]["pid"], 0)


def test_a_crash_restarts_from_the_newest_checkpoint(shared_server, shared_http, tmp_path):
    run_id = "sup-crash"
    result, starts = supervise(shared_server.url, run_id, tmp_path, "--steps", "60", "--crash-at", "25")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [s["resume"].rsplit("/", 1)[-1] for s in starts] == ["", "step19.json"]
    [event] = supervised_events(shared_http, run_id)
    assert (event["kind"], event["step"], event["data"]["reason_code"]) == ("restart", 19, "crash")
    assert any("restart 1/3 (crash)" in line and "exited with status 1" in line
               for line in progress(result))


def test_the_service_down_for_the_whole_run_leaves_the_job_alone(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"                   # nothing listens there
    result, starts = supervise(url, "sup-down", tmp_path, "--steps", "60",
                               sup_args=("--world-size", "2"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(starts) == 1 and starts[0]["world_size"] == "2"
    lines = progress(result)
    assert not any("404" in line for line in lines)
    [down] = [line for line in lines if "cannot reach" in line]
    assert "the job is left running" in down and lines[-1].endswith("(exit status 0)")
