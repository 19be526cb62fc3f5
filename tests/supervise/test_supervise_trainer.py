"""``healthsvc supervise`` over the real example trainer (examples/train.py: 4 gloo ranks on the
CPU) against a real server: a NaN restarts it from the rollback answer's checkpoint; the trainer's
fault is in its data (``--fault nan --fault-step 30`` fires again in the resumed run), so the same
NaN comes back at the same step after the resume from the same checkpoint, and the supervisor
stops rather than loop."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.supervise.test_supervise_cli import progress, supervised_events

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"


def test_the_example_trainer_is_restarted_after_a_nan_and_stopped_when_it_comes_back(
        shared_server, shared_http, tmp_path):
    run_id = "sup-trainer"
    url = shared_server.url
    assert shared_http.put(f"/v1/runs/{run_id}", json={"world_size": 4}).status_code == 200
    train = [sys.executable, str(TRAIN), "--url", url, "--run-id", run_id, "--log-every", "0",
             "--heartbeat-s", "0.5", "--ckpt-dir", str(tmp_path / "ckpt"), "--steps", "300",
             "--ckpt-every", "10", "--fault", "nan", "--fault-rank", "2",
             "--fault-step", "30", "--resume", "{checkpoint}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "healthsvc", "supervise", "--run-id", run_id, "--url",
                          url, "--poll-s", "0.3", "--grace-s", "10", "--", *train],
                         capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path,
                         check=False)
    assert out.returncode == 3, out.stderr[-4000:]
    [event] = supervised_events(shared_http, run_id)
    assert event["kind"] == "rollback" and event["step"] < 30
    assert event["data"]["causes"][0] == ["non_finite", 30]
    lines = progress(out)
    assert any(f"restart 1/3 (finding): Restart from step {event['step']}" in line for line in lines)
    [stopped] = [line for line in lines if "supervise: stopped (" in line]
    assert "stopped (same_corruption_again)" in stopped
    assert stopped.endswith(f"The same non_finite at step 30 came back after the restart from step "
                            f"{event['step']}; restarting from it again would repeat it.")
    shared_http.drain()
    again = shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "non_finite"}).json()
    assert {(f["attempt"], f["step"]) for f in again if f["ranks"] == [2]} == {(1, 30), (2, 30)}
    run = shared_http.get(f"/v1/runs/{run_id}").json()
    assert run["attempt"] == 2 and run["status"] == "running"     # stopped, not finished
