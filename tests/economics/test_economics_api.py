"""Run economics over HTTP, against the real server (the shared one, in process): a crash with fewer ranks coming back, and a
rollback past a corruption."""
import math

import pytest

pytestmark = pytest.mark.both_stores


def _push(http, run_id, steps, ranks, step_time):
    cols = {"step": [s for s in steps for _ in ranks], "rank": [r for _ in steps for r in ranks]}
    n = len(cols["step"])
    cols.update(loss=[2.0] * n, grad_norm=[1.0] * n, step_time=[step_time] * n)
    r = http.post(f"/v1/runs/{run_id}/metrics", json={"columns": cols})
    assert r.status_code == 202, r.text


def _checkpoint(http, run_id, step, duration_s, size=1000):
    r = http.post(f"/v1/runs/{run_id}/checkpoints",
                  json={"step": step, "uri": f"file:///ckpt/{run_id}/{step}", "duration_s": duration_s, "bytes": size})
    assert r.status_code in (200, 201, 202), r.text


def _two_attempts(http, run_id, *, second_ranks, rollback_event=None):
    """Attempt 1: steps 0..39 on 8 ranks at 0.5 s, checkpoints 19 (30 s) and 39 (50 s).
    Attempt 2 resumes from 19: steps 20..59 at 0.6 s, checkpoint 59 (40 s)."""
    assert http.put(f"/v1/runs/{run_id}", json={"world_size": 8, "batch_size_per_rank": 16}).status_code == 200
    _push(http, run_id, range(0, 20), range(8), 0.5)
    _checkpoint(http, run_id, 19, 30.0)
    _push(http, run_id, range(20, 40), range(8), 0.5)
    _checkpoint(http, run_id, 39, 50.0)
    http.service.advance(0.2)  # downtime between the attempts: the service's clock jumps ahead
    if rollback_event is not None:
        assert http.post(f"/v1/runs/{run_id}/events", json=rollback_event).status_code in (200, 201, 202)
    _push(http, run_id, range(20, 60), second_ranks, 0.6)
    _checkpoint(http, run_id, 59, 40.0)


@pytest.fixture(scope="module")
def elastic_run(shared_http):
    _two_attempts(shared_http, "econ-elastic", second_ranks=range(6))
    return "econ-elastic"


@pytest.fixture(scope="module")
def rollback_run(shared_http):
    _two_attempts(shared_http, "econ-rollback", second_ranks=range(8),
                  rollback_event={"kind": "rollback", "step": 19, "data": {"onset_step": 25}})
    return "econ-rollback"


def test_timeline_records_the_restart_and_the_detected_world_size_change(shared_http, elastic_run):
    body = shared_http.get(f"/v1/runs/{elastic_run}/timeline").json()
    kinds = [e["kind"] for e in body["entries"]]
    assert kinds.count("attempt_started") == 2 and kinds.count("checkpoint") == 3
    assert (body["attempts"], body["restarts"], body["world_size_changes"]) == (2, 1, 1)
    (change,) = [e for e in body["entries"] if e["kind"] == "world_size_change"]
    assert change["source"] == "detected"
    assert (change["old_world_size"], change["new_world_size"]) == (8, 6)
    assert (change["old_effective_batch_size"], change["new_effective_batch_size"]) == (128, 96)
    assert change["ranks_lost"] == [6, 7] and change["step"] == 20
    restart = [e for e in body["entries"] if e["kind"] == "attempt_started"][1]
    assert restart["resumed_from_step"] == 19 and restart["downtime_s"] >= 0.15
    assert [e["at_s"] for e in body["entries"]] == sorted(e["at_s"] for e in body["entries"])


def test_run_summary_carries_the_timeline(shared_http, elastic_run):
    summary = shared_http.get(f"/v1/runs/{elastic_run}").json()
    assert summary["timeline"]["world_size_changes"] == 1
    assert summary["timeline"]["restarts"] == 1


def test_advice_uses_observed_checkpoint_cost_and_restarts(shared_http, elastic_run):
    body = shared_http.get(f"/v1/runs/{elastic_run}/advice",
                           params={"prior_mtbf_s": 14400, "pseudo_failures": 2}).json()
    assert body["checkpoint_cost_s"] == pytest.approx(40.0)          # mean of 30, 50, 40
    mtbf = body["mtbf"]
    assert mtbf["failures"] == 1 and mtbf["source"] == "blended"
    assert mtbf["mtbf_s"] == pytest.approx((2 * 14400 + mtbf["exposure_s"]) / 3)
    assert body["young_interval_s"] == pytest.approx(math.sqrt(2 * 40.0 * mtbf["mtbf_s"]))
    assert body["restart_cost_source"] == "observed"
    # checkpoints every 20 steps at the newest attempt's 0.6 s/step: 12 s, far below the optimum
    assert body["current_interval_steps"] == 20 and body["current_interval_s"] == pytest.approx(12.0)
    assert body["warning"] is not None and "less often" in body["warning"]
    assert set(body["overhead"]) == {"young", "daly", "current"}


def test_advice_without_a_prior_uses_the_organisation_or_default_figure(shared_http, elastic_run):
    body = shared_http.get(f"/v1/runs/{elastic_run}/advice").json()
    assert body["mtbf"]["prior"]["source"] in ("organisation", "default")


def test_goodput_splits_recomputed_steps_from_productive_ones(shared_http, elastic_run):
    g = shared_http.get(f"/v1/runs/{elastic_run}/goodput").json()
    assert g["productive_steps"] == 60          # 0..19 of attempt 1, 20..59 of attempt 2
    assert g["recomputed_steps"] == 20          # 20..39 redone after resuming from 19
    assert g["corrupted_steps"] == 0
    assert g["checkpoint_s"] == pytest.approx(120.0)
    assert g["productive_s"] == pytest.approx(20 * 0.5 + 40 * 0.6)


def test_rollback_after_corruption_counts_thrown_away_progress_and_keeps_the_target(shared_http, rollback_run):
    g = shared_http.get(f"/v1/runs/{rollback_run}/goodput").json()
    # attempt 1's 20..39 were thrown away: 20..24 plain recompute, 25..39 corrupted progress
    assert (g["recomputed_steps"], g["corrupted_steps"]) == (5, 15)
    assert g["corrupted_progress_s"] == pytest.approx(15 * 0.5)

    plan = shared_http.get(f"/v1/runs/{rollback_run}/retention",
                           params={"keep_recent": 1, "max_count": 2}).json()
    by_step = {c["step"]: c for c in plan["checkpoints"]}
    # detection lag 39 - 25 = 14 steps, x1.5 -> 21: keep a checkpoint < 59 - 21 = 38
    assert plan["lag_window_steps"] == 21
    assert by_step[19]["action"] == "keep" and "rollback_target" in by_step[19]["reasons"]
    assert by_step[59]["action"] == "keep" and by_step[59]["reasons"] == ["recent"]
    assert by_step[39]["action"] == "delete" and by_step[39]["reasons"] == ["known_corrupted"]
    assert plan["kept_count"] == 2 and not plan["over_budget"]

    events = [e for e in shared_http.get(f"/v1/runs/{rollback_run}/timeline").json()["entries"]
              if e["kind"] == "event"]
    assert [e["event_kind"] for e in events] == ["rollback"]


def test_errors_name_the_problem(shared_http, elastic_run):
    assert shared_http.get("/v1/runs/no-such-run/advice").status_code == 404
    assert shared_http.get("/v1/runs/no-such-run/timeline").status_code == 404
    r = shared_http.get(f"/v1/runs/{elastic_run}/retention", params={"sparse_base": 1})
    assert r.status_code == 422
