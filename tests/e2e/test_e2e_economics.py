"""End to end: the real example trainer (4 gloo ranks on the CPU) with a rollback restart and an
elastic leave against a real server; the run's timeline and goodput from the API.

Two launches of examples/train.py, checkpoints every 20 steps:

1. steps 0-69 (4 ranks): checkpoints 19, 39, 59;
2. ``--resume-from-rollback``: nothing is corrupted, so the service names the newest checkpoint,
   59; steps 60-89 again (attempt 2, a ``rollback`` event at 59), checkpoint 79; rank 3 dies at
   step 90; the job restarts elastically with 3 ranks from the newest checkpoint, 79 (attempt 3:
   ``restart`` and ``world_size_change`` events, and no second ``rollback``), steps 80-109,
   checkpoint 99.
"""
from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from tests.e2e.test_e2e_training import train  # noqa: E402  (same driver as the other e2e tests)

pytestmark = pytest.mark.e2e

RUN = "e2e-economics"
PER_RANK_BATCH = 8


@pytest.fixture(scope="module")
def economics_run(shared_server, shared_http, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("economics")
    config = {"world_size": 4, "batch_size_per_rank": PER_RANK_BATCH}
    assert shared_http.put(f"/v1/runs/{RUN}", json=config).status_code == 200
    ckpt = ["--ckpt-every", "20"]
    first = train(shared_server.url, RUN, workdir, "--steps", "70", *ckpt)
    second = train(shared_server.url, RUN, workdir, "--steps", "110", "--resume-from-rollback", *ckpt,
                   "--fault", "leave", "--fault-rank", "3", "--fault-step", "90")
    return first, second


def test_launches_resumed_where_expected(economics_run):
    first, second = economics_run
    # The second launch's last summary is the elastic restart's, after checkpoint 79.
    assert (first["start_step"], second["start_step"]) == (0, 80)


def test_timeline_shows_attempts_rollback_world_size_change_and_checkpoints(economics_run, shared_http):
    answer = shared_http.get(f"/v1/runs/{RUN}/timeline")
    assert answer.status_code == 200, answer.text
    timeline = answer.json()
    entries = timeline["entries"]
    assert timeline["attempts"] == 3 and timeline["restarts"] == 2 and timeline["world_size_changes"] == 1
    assert [e["at_s"] for e in entries] == sorted(e["at_s"] for e in entries)

    started = [e for e in entries if e["kind"] == "attempt_started"]
    assert [(e["attempt"], e["step"], e["is_restart"], e["world_size"], e["effective_batch_size"]) for e in started] == [
        (1, 0, False, 4, 4 * PER_RANK_BATCH), (2, 60, True, 4, 4 * PER_RANK_BATCH), (3, 80, True, 3, 3 * PER_RANK_BATCH)]
    assert all(e["downtime_s"] > 0 for e in started[1:])
    ended = [(e["attempt"], e["step"]) for e in entries if e["kind"] == "attempt_ended"]
    assert ended == [(1, 69), (2, 89), (3, 109)]

    events = [(e["event_kind"], e["step"]) for e in entries if e["kind"] == "event"]
    assert ("rollback", 59) in events and ("restart", 79) in events
    assert [e for e in events if e[0] == "rollback"] == [("rollback", 59)]

    changes = [e for e in entries if e["kind"] == "world_size_change"]
    assert len(changes) == 1
    change = changes[0]
    assert (change["old_world_size"], change["new_world_size"]) == (4, 3)
    assert (change["old_effective_batch_size"], change["new_effective_batch_size"]) == (32, 24)
    assert change["source"] == "event" and change["step"] == 80

    checkpoints = [(e["step"], e["attempt"]) for e in entries if e["kind"] == "checkpoint"]
    assert checkpoints == [(19, 1), (39, 1), (59, 1), (79, 2), (99, 3)]
    assert all(e["duration_s"] > 0 and e["size_bytes"] > 0 for e in entries if e["kind"] == "checkpoint")
    # The run summary carries the same timeline, without findings.
    summary = shared_http.get(f"/v1/runs/{RUN}").json()
    assert summary["timeline"]["attempts"] == 3
    assert not [e for e in summary["timeline"]["entries"] if e["kind"] == "finding"]


def test_goodput_counts_productive_and_recomputed_steps(economics_run, shared_http):
    g = shared_http.get(f"/v1/runs/{RUN}/goodput").json()
    # Effective history: 0-59 (attempt 1), 60-79 (attempt 2), 80-109 (attempt 3).
    assert g["productive_steps"] == 110
    # Redone: attempt 1's 60-69 (after the rollback to 59) and attempt 2's 80-89 (after the
    # elastic restart from 79). The service reads a rollback as a corruption found at the step the
    # abandoned attempt had reached (onset: the step after the target), so attempt 1's redone
    # steps count as corrupted progress.
    assert g["recomputed_steps"] + g["corrupted_steps"] == 20
    assert g["corrupted_steps"] >= 10
    checkpoints = shared_http.get(f"/v1/runs/{RUN}/checkpoints").json()
    assert g["checkpoint_s"] == pytest.approx(sum(c["duration_s"] for c in checkpoints))
    parts = ("productive_s", "checkpoint_s", "downtime_s", "recompute_s", "corrupted_progress_s", "unaccounted_s")
    assert sum(g[p] for p in parts) == pytest.approx(g["wall_s"])
    assert g["downtime_s"] > 0 and g["recompute_s"] + g["corrupted_progress_s"] > 0
    assert 0 < g["goodput_fraction"] < 1 and g["goodput_fraction"] == pytest.approx(g["productive_s"] / g["wall_s"])


def test_advice_uses_the_observed_checkpoint_cost_and_failures(economics_run, shared_http):
    a = shared_http.get(f"/v1/runs/{RUN}/advice", params={"prior_mtbf_s": 3600}).json()
    checkpoints = shared_http.get(f"/v1/runs/{RUN}/checkpoints").json()
    assert a["checkpoints_observed"] == 5
    assert a["checkpoint_cost_s"] == pytest.approx(sum(c["duration_s"] for c in checkpoints) / 5)
    # The rollback, the elastic restart and the attempts they open all fall within 600 s of each
    # other: one failure (docs/economics.md merges incidents that close together).
    assert a["mtbf"]["failures"] == 1 and a["mtbf"]["exposure_s"] > 0
    assert a["young_interval_s"] == pytest.approx(math.sqrt(2 * a["checkpoint_cost_s"] * a["mtbf"]["mtbf_s"]))
