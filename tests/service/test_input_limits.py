"""Validation at every boundary (issue 12, findings 1, 2, 4, 5): what a hostile client sends is a
422 naming the field, never a 500, never a stored value that breaks detection or startup."""
from __future__ import annotations

import os

import httpx
import pytest

pytestmark = pytest.mark.both_stores

from healthsvc.settings import Settings
from tests.harness import InProcessService

BIG = 2**63


def _loc(resp: httpx.Response) -> list:
    assert resp.status_code == 422, (resp.status_code, resp.text)
    return resp.json()["detail"][0]["loc"]


@pytest.mark.parametrize("params, field", [
    ({"straggler": {"critical_ratio": float("inf")}}, "critical_ratio"),
    ({"straggler": {"min_ratio": 0}}, "min_ratio"),
    ({"straggler": {"cusum_h": -1}}, "cusum_h"),
    ({"straggler": {"warmup_steps": True}}, "warmup_steps"),
    ({"straggler": {"warmup_steps": 2.5}}, "warmup_steps"),
    ({"slowdown": {"history_steps": 10**12}}, "history_steps"),
    ({"rank_outlier": {"window_steps": 0}}, "window_steps"),
    ({"loss_spike": {"alpha": 1.5}}, "alpha"),
    ({"loss_spike": {"kind": "grad_spike"}}, "kind"),
    ({"non_finite": {"metrics": []}}, "metrics"),
    ({"non_finite": {"metrics": ["a b"]}}, "metrics"),
    ({"hang": {"timeout_floor_s": 1e300}}, "timeout_floor_s"),
    ({"divergence": {"no_such": 1}}, "no_such"),
    ({"divergence": {"enabled": "no"}}, "enabled"),
])
def test_a_bad_detector_parameter_is_a_422_naming_it(shared_http, params, field):
    # json.dumps writes inf as the Infinity token, which the service's JSON parser accepts.
    import json
    resp = shared_http.put("/v1/runs/cfg", content=json.dumps({"detectors": params}),
                           headers={"content-type": "application/json"})
    loc = _loc(resp)
    assert loc[-1] == field and list(params)[0] in loc, loc


def test_good_detector_parameters_are_accepted_and_kept(shared_http):
    cfg = {"detectors": {"straggler": {"min_ratio": 1.1, "critical_ratio": 2, "warmup_steps": 20},
                         "non_finite": {"metrics": ["loss"]}, "divergence": {"enabled": False}}}
    resp = shared_http.put("/v1/runs/cfg-ok", json=cfg)
    assert resp.status_code == 200, resp.text
    assert resp.json()["config"]["detectors"]["straggler"]["critical_ratio"] == 2


@pytest.mark.parametrize("path, body, field", [
    ("/v1/runs/big/events", {"kind": "note", "step": BIG}, "step"),
    ("/v1/runs/big/events", {"kind": "note", "data": {"x": [1, BIG]}}, "data"),
    ("/v1/runs/big/events", {"kind": "world_size_change", "data": {"old": 8, "new": 3_000_000}}, "new"),
    ("/v1/runs/big/checkpoints", {"step": BIG, "uri": "s3://x"}, "step"),
    ("/v1/runs/big/checkpoints", {"step": 1, "uri": "s3://x", "bytes": BIG}, "bytes"),
    ("/v1/runs/big/checkpoints", {"step": 1, "uri": "s3://x", "duration_s": 1e308}, "duration_s"),
    ("/v1/runs/big/checkpoints", {"step": False, "uri": "s3://x"}, "step"),
    ("/v1/runs/big/heartbeats", {"rank": 0, "step": BIG}, "step"),
    ("/v1/runs/big/heartbeats", {"rank": 2**40}, "rank"),
    ("/v1/runs/big/heartbeats", {"rank": False}, "rank"),
    ("/v1/runs/big/heartbeats", {"rank": 689.0}, "rank"),
    ("/v1/runs/big/finish", {"rank": 1e30}, "rank"),
    ("/v1/runs/big/finish", {"rank": 10**30}, "rank"),
    ("/v1/runs/big/finish", {"rank": 1_048_576}, "rank"),
    ("/v1/runs/big/metrics", {"records": [{"step": 0, "rank": 50_000_000, "loss": 1.0}]}, "rank"),
    ("/v1/runs/big/metrics", {"records": [{"step": BIG, "rank": 0, "loss": 1.0}]}, "step"),
    ("/v1/runs/big/metrics", {"columns": {"step": [0, 1], "rank": [1, True]}}, "rank"),
    ("/v1/runs/big/metrics", {"records": [{"step": 0, "rank": 0, "world_size": 3e6}]}, "world_size"),
])
def test_out_of_range_numbers_are_a_422_naming_the_field(shared_http, path, body, field):
    assert field in _loc(shared_http.post(path, json=body))


def test_out_of_range_query_numbers_and_run_world_size(shared_http):
    assert shared_http.post("/v1/runs/q/metrics", json={"records": [{"step": 0, "rank": 0, "loss": 1}]}).status_code == 202
    for path, params, field in [("/v1/runs/q/findings", {"since_step": BIG}, "since_step"),
                                ("/v1/runs/q/metrics", {"step_min": BIG}, "step_min"),
                                ("/v1/runs/q/metrics", {"ranks": str(BIG)}, "ranks"),
                                ("/v1/runs/q/findings", {"since": "1e308"}, "since")]:
        assert field in _loc(shared_http.get(path, params=params)), path
    for path, params, field in [("/v1/runs/q/advice", {"pseudo_failures": "6.5e307"}, "pseudo_failures"),
                                ("/v1/runs/q/advice", {"prior_mtbf_s": "1e308"}, "prior_mtbf_s"),
                                ("/v1/runs/q/retention", {"sparse_base": "1e308"}, "sparse_base"),
                                ("/v1/runs/q/retention", {"max_bytes": str(BIG)}, "max_bytes"),
                                ("/v1/runs/q/retention", {"lag_margin_factor": "inf"}, "lag_margin_factor")]:
        assert field in _loc(shared_http.get(path, params=params)), (path, params)
    assert "world_size" in _loc(shared_http.put("/v1/runs/q", json={"world_size": 3_000_000}))
    assert "world_size" in _loc(shared_http.put("/v1/runs/q", json={"world_size": True}))


def test_a_refused_finish_leaves_the_run_working(shared_http):
    """Finding 2: `finish {"rank": 1e30}` used to make every later push a 500."""
    run = "/v1/runs/fin"
    assert shared_http.post(run + "/metrics", json={"records": [{"step": 0, "rank": 0, "loss": 1}]}).status_code == 202
    assert shared_http.post(run + "/finish", json={"rank": 1e30}).status_code == 422
    assert shared_http.post(run + "/finish", json={"rank": 10**30}).status_code == 422   # the integer form
    for step in range(1, 4):
        resp = shared_http.post(run + "/metrics", json={"records": [{"step": step, "rank": 0, "loss": 1}]})
        assert resp.status_code == 202, resp.text
    assert shared_http.get(run).json()["last_step"] == 3


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_memory_follows_ranks_seen_not_the_largest_rank_id(tmp_path):
    """Finding 4: a 61-byte push with rank 5e7 used to add 576 MiB. With max_ranks raised to let
    it through, it must cost about what rank 0 costs. (In process, so a drain tells when the
    monitor and the rollups have taken every step; the RSS is this process's.)"""
    with InProcessService(tmp_path, db=tmp_path / "m.db", max_ranks=10**9) as svc:
        c = svc.http
        assert c.post("/v1/runs/w/metrics", json={"records": [{"step": 0, "rank": 0, "loss": 1.0}]}).status_code == 202
        c.get("/v1/runs/w")
        svc.advance(1.0)
        before = _rss_bytes(os.getpid())
        for step in range(1, 30):
            body = {"records": [{"step": step, "rank": 50_000_000 + step, "loss": 1.0, "host": "h"}]}
            assert c.post("/v1/runs/w/metrics", json=body).status_code == 202
        assert c.get("/v1/runs/w").json()["ranks_seen"] == 30
        svc.advance(Settings().align_timeout_s)   # the monitor (aligner waits) takes the steps too
        c.get("/v1/runs/w")
        grown = _rss_bytes(os.getpid()) - before
        assert grown < 40 * 2**20, f"RSS grew {grown / 2**20:.0f} MiB for 29 ranks"
