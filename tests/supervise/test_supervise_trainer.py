"""``healthsvc supervise`` over the real example trainer (examples/train.py: 4 gloo ranks on the
CPU) against a real server.

- A NaN restarts it from the rollback answer's checkpoint; the trainer's fault is in its data
  (``--fault nan --fault-step 30`` fires again in the resumed run), so the same NaN comes back at
  the same step after the resume from the same checkpoint, and the supervisor stops rather than
  loop. A transient NaN (``--fault-transient``: the first attempt only, as a hardware error)
  restarts it once, and the resumed run finishes healthy; with its sampler restarting on the
  resume too, the resume_mismatch stops the supervisor.
- With the service unreachable for the whole run, the trainer runs to its end untouched.
- A bit flipped in one replica's weights, fingerprints on: the four ranks play four hosts
  (``--hosts``); the restart is from the checkpoint the fingerprints prove clean, without the
  blamed host (``--exclude {exclude_hosts}``: the trainer starts 3 ranks, and the fault, which
  follows its host, is gone), recorded as one elastic change 4 -> 3, and the run finishes."""
from __future__ import annotations

import json
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


HOSTS = "node0,node1,node2,node3"


def supervise_trainer(url: str, run_id: str, tmp_path: Path, *train_args: str,
                      timeout_s: float = 180.0) -> subprocess.CompletedProcess:
    """``healthsvc supervise`` over the example trainer, resuming from ``{checkpoint}``."""
    train = [sys.executable, str(TRAIN), "--url", url, "--run-id", run_id, "--log-every", "0",
             "--heartbeat-s", "0.5", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "10",
             "--resume", "{checkpoint}", *train_args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HEALTHSVC_URL", None)
    return subprocess.run([sys.executable, "-m", "healthsvc", "supervise", "--run-id", run_id, "--url",
                           url, "--poll-s", "0.3", "--grace-s", "10", "--", *train],
                          capture_output=True, text=True, timeout=timeout_s, env=env, cwd=tmp_path,
                          check=False)


def test_the_example_trainer_is_restarted_after_a_nan_and_stopped_when_it_comes_back(
        shared_server, shared_http, tmp_path):
    run_id = "sup-trainer"
    assert shared_http.put(f"/v1/runs/{run_id}", json={"world_size": 4}).status_code == 200
    out = supervise_trainer(shared_server.url, run_id, tmp_path, "--steps", "300", "--fault", "nan",
                            "--fault-rank", "2", "--fault-step", "30")
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


def why_no_checkpoint(http, run_id: str, ckpt_dir: Path) -> str:
    """The run's rollback answer, stored checkpoints and events now, and the checkpoint files the
    trainer wrote, as text (for a failure's message: CI twice saw no checkpoint stored at all,
    with every rank's records past the cause stored; whether the files were there says whether
    the trainer or its client's registrations went missing)."""
    files = sorted(p.name for p in ckpt_dir.glob("*")) if ckpt_dir.is_dir() else None
    return (f"\nrollback answer: {json.dumps(http.get(f'/v1/runs/{run_id}/rollback').json())}"
            f"\ncheckpoints: {json.dumps(http.get(f'/v1/runs/{run_id}/checkpoints').json())}"
            f"\nevents: {json.dumps(http.get(f'/v1/runs/{run_id}/events').json())[:2000]}"
            f"\ncheckpoint files: {files}")


def test_a_transient_nan_restarts_from_the_newest_clean_checkpoint_and_the_run_finishes_healthy(
        shared_server, shared_http, tmp_path):
    run_id = "sup-transient"
    assert shared_http.put(f"/v1/runs/{run_id}", json={"world_size": 4}).status_code == 200
    out = supervise_trainer(shared_server.url, run_id, tmp_path, "--steps", "150", "--fault", "nan",
                            "--fault-rank", "2", "--fault-step", "30", "--fault-transient")
    # On failure, what the decision rested on: the rollback answer and the checkpoints stored
    # (CI saw no_clean_checkpoint here twice, 6 and 8 December 2026, not reproduced since).
    assert out.returncode == 0, out.stderr[-4000:] + why_no_checkpoint(shared_http, run_id, tmp_path / "ckpt")
    [event] = supervised_events(shared_http, run_id)
    assert (event["kind"], event["attempt"]) == ("rollback", 1) and event["step"] < 30
    assert event["data"]["causes"][0] == ["non_finite", 30]
    found = [f for f in shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "non_finite"}).json()
             if f["status"] == "firing"]
    assert {f["attempt"] for f in found} == {1}          # attempt 2 trained clean
    shared_http.drain()
    run = shared_http.get(f"/v1/runs/{run_id}").json()
    assert (run["status"], run["attempt"], run["last_step"]) == ("finished", 2, 149), run
    entries = shared_http.get(f"/v1/runs/{run_id}/timeline").json()["entries"]
    [started] = [e for e in entries if e["kind"] == "attempt_started" and e["attempt"] == 2]
    assert started["resumed_from_step"] == event["step"]
    [restarted] = [e for e in entries if e["kind"] == "event" and e["event_kind"] == "rollback"]
    assert {(c["kind"], c["step"]) for c in restarted["decision"]["causes"]} == {("non_finite", 30)}
    # Within 10 s of the finding: the restart's event is posted after the job was stopped.
    assert restarted["at_s"] - found[0]["created_at"] <= 10.0


def test_a_resume_that_restarts_the_data_is_a_resume_mismatch_and_the_supervisor_stops(
        shared_server, shared_http, tmp_path):
    # A transient NaN makes the first restart; the resumed trainer's sampler starts its stream
    # again (its data position goes back to 0): the restore is what is wrong, so no loop.
    run_id = "sup-resume-reset"
    assert shared_http.put(f"/v1/runs/{run_id}", json={"world_size": 4}).status_code == 200
    out = supervise_trainer(shared_server.url, run_id, tmp_path, "--steps", "150", "--fault",
                            "nan,resume_sampler_reset", "--fault-rank", "2", "--fault-step", "30",
                            "--fault-transient")
    assert out.returncode == 3, out.stderr[-4000:]
    [event] = supervised_events(shared_http, run_id)
    assert event["kind"] == "rollback" and event["step"] < 30
    [stopped] = [line for line in progress(out) if "supervise: stopped (" in line]
    assert "stopped (resume_mismatch): A resume_mismatch at step" in stopped
    shared_http.drain()
    mismatch = shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "resume_mismatch"}).json()
    assert mismatch and {f["attempt"] for f in mismatch} == {2} and mismatch[0]["metric"] == "data_cursor"


def test_a_hung_rank_restarts_the_trainer_without_its_host_within_ten_seconds_of_the_finding(
        shared_server, shared_http, tmp_path):
    # Rank 3 (node3) hangs outside the collective at step 40; its peers wait inside it. Found by
    # the default detectors, the job is restarted without node3 (4 -> 3 ranks) and finishes.
    run_id = "sup-hang-trainer"
    assert shared_http.put(f"/v1/runs/{run_id}", json={"world_size": 4}).status_code == 200
    out = supervise_trainer(shared_server.url, run_id, tmp_path, "--steps", "100", "--fault", "hang",
                            "--fault-rank", "3", "--fault-step", "40", "--hang-s", "300",
                            "--hang-where", "outside", "--hosts", HOSTS, "--exclude", "{exclude_hosts}")
    assert out.returncode == 0, out.stderr[-4000:]
    [event] = supervised_events(shared_http, run_id)
    assert event["data"]["exclude_hosts"] == ["node3"] and event["data"]["world_size"] == {"old": 4, "new": 3}
    shared_http.drain()
    hangs = [f for f in shared_http.get(f"/v1/runs/{run_id}/findings").json()
             if f["kind"] in ("hang", "stall") and f["status"] == "firing" and f["attempt"] == 1]
    assert any(3 in f["ranks"] for f in hangs), hangs   # (a stall, run-wide, may come first)
    entries = shared_http.get(f"/v1/runs/{run_id}/timeline").json()["entries"]
    [restarted] = [e for e in entries if e["kind"] == "event" and e["event_kind"] in ("rollback", "restart")]
    assert restarted["at_s"] - min(f["created_at"] for f in hangs) <= 10.0
    run = shared_http.get(f"/v1/runs/{run_id}").json()
    assert (run["status"], run["attempt"], run["last_step"]) == ("finished", 2, 99), run


def test_the_service_down_for_the_whole_run_leaves_the_example_trainer_alone(tmp_path):
    from tests.server_process import free_port
    url = f"http://127.0.0.1:{free_port()}"                   # nothing listens there
    out = supervise_trainer(url, "sup-down-trainer", tmp_path, "--steps", "60")
    assert out.returncode == 0, out.stderr[-4000:]
    lines = progress(out)
    [down] = [line for line in lines if "cannot reach" in line]
    assert "the job is left running" in down and lines[-1].endswith("(exit status 0)")
    assert (tmp_path / "ckpt" / "ckpt_000059.pt").exists()    # it trained to its last step


def test_a_replica_bit_flip_restarts_from_the_proven_checkpoint_without_the_blamed_host(
        shared_server, shared_http, tmp_path):
    run_id = "sup-bitflip"
    assert shared_http.put(f"/v1/runs/{run_id}", json={"world_size": 4}).status_code == 200
    # The flip lands after the update of step 23; the fingerprint of step 24 sees it, the one of
    # step 19 (a checkpoint step) is the last where the replicas agree.
    out = supervise_trainer(shared_server.url, run_id, tmp_path, "--steps", "200",
                            "--fingerprint-every", "5", "--fault", "weight_bitflip",
                            "--fault-rank", "2", "--fault-step", "23", "--hosts", HOSTS,
                            "--exclude", "{exclude_hosts}")
    assert out.returncode == 0, out.stderr[-4000:]
    [event] = supervised_events(shared_http, run_id)
    data = event["data"]
    assert (event["kind"], event["step"], event["attempt"]) == ("rollback", 19, 1)
    assert data["causes"][0] == ["replica_mismatch", 24]
    assert data["exclude_hosts"] == ["node2"] and data["world_size"] == {"old": 4, "new": 3}
    assert data["uri"].endswith("ckpt_000019.pt")
    # One elastic change, 4 -> 3, at the checkpoint: the supervisor's (the trainer, told which
    # hosts are out, does not record it a second time).
    changes = [e for e in shared_http.get(f"/v1/runs/{run_id}/events").json()
               if e["kind"] == "world_size_change"]
    assert [(c["step"], c["data"]["old"], c["data"]["new"]) for c in changes] == [(19, 4, 3)]
    [restart] = [line for line in progress(out) if "restart 1/3" in line]
    assert "(finding): Restart from step 19" in restart and "World size 4 -> 3." in restart
    shared_http.drain()
    run = shared_http.get(f"/v1/runs/{run_id}").json()
    assert (run["status"], run["attempt"], run["last_step"]) == ("finished", 2, 199), run
    # Attempt 2 ran on three hosts, node2 not among them, and its replicas agreed throughout. The
    # one mismatch is attempt 1's, naming node2's rank, never resolved: the stopped ranks' last
    # fingerprint rows (two digests of four, or one: ranks flush on their own) are judged neither
    # as a mismatch naming a healthy rank nor as an agreement that resolves it
    # (test_restart_replica_rows.py replays that exactly).
    found = shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "replica_mismatch"}).json()
    assert [(f["attempt"], f["step"], f["ranks"], f["hosts"], f["status"]) for f in found] == [
        (1, 24, [2], ["node2"], "firing")], found
    entries = shared_http.get(f"/v1/runs/{run_id}/timeline").json()["entries"]
    [started] = [e for e in entries if e["kind"] == "attempt_started" and e["attempt"] == 2]
    assert (started["world_size"], started["resumed_from_step"]) == (3, 19)
    [change] = [e for e in entries if e["kind"] == "world_size_change"]
    assert (change["old_world_size"], change["new_world_size"], change["step"]) == (4, 3, 19)
    # The restart on the timeline: who decided, from which checkpoint, without which host, the
    # sizes, and the finding that caused it.
    [restarted] = [e for e in entries if e["kind"] == "event" and e["event_kind"] == "rollback"]
    assert restarted["decision"] == {
        "decided_by": "healthsvc supervise", "reason_code": "finding", "from_attempt": 1,
        "checkpoint_step": 19, "checkpoint_uri": data["uri"], "exclude_hosts": ["node2"],
        "old_world_size": 4, "new_world_size": 3, "causes": [{"kind": "replica_mismatch", "step": 24}]}
    # The goodput counts the work the rollback threw away: every step of attempt 1 after the
    # checkpoint, all of them from the onset the proof gives (20) on, so lost to corruption
    # (not counted again as recomputed).
    [ended] = [e for e in entries if e["kind"] == "attempt_ended" and e["attempt"] == 1]
    goodput = shared_http.get(f"/v1/runs/{run_id}/goodput").json()
    assert (goodput["recomputed_steps"], goodput["corrupted_steps"]) == (0, ended["step"] - 19), goodput
