"""Detection inside the real service: findings with ranks and hosts, state that survives a crash
without repeating findings, attempts restarting detection, and hangs from the server's clock."""
from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from simulation import NonFinite, Straggler, simulate_run
from healthsvc.monitor.aligner import StepAligner
from healthsvc.ingest.batch import MetricBatch
from healthsvc.testing import ServerProcess


def column_pushes(block, hosts=None, steps_per_push=10):
    """The trace as rank-0 aggregator pushes: JSON bodies of `steps_per_push` steps x all ranks."""
    n, r = block.n_steps, block.n_ranks
    for start in range(0, n, steps_per_push):
        sl = slice(start, min(n, start + steps_per_push))
        k = sl.stop - sl.start
        cols = {"step": np.repeat(block.steps[sl], r).tolist(), "rank": np.tile(block.ranks, k).tolist()}
        for m, v in block.values.items():
            vals = v[sl].ravel().tolist()
            pres = block.present[m][sl].ravel()
            cols[m] = [x if p else None for x, p in zip(vals, pres)]
        if hosts is not None:
            cols["host"] = [hosts[int(x)] for x in cols["rank"]]
        yield json.dumps({"columns": cols}).encode()  # NaN leaves as a NaN token


def findings(http, run, **params):
    return http.get(f"/v1/runs/{run}/findings", params=params).json()


def wait_for(fn, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = fn()
        if out:
            return out
        time.sleep(0.2)
    return fn()


def test_nan_origin_rank_and_host(http):
    run = simulate_run(n_steps=400, n_ranks=16, seed=3, faults=[NonFinite(step=300, rank=5)])
    hosts = {r: f"node{r // 4}" for r in range(16)}
    http.put("/v1/runs/nan", json={"world_size": 16})
    for body in column_pushes(run.block, hosts):
        assert http.post("/v1/runs/nan/metrics", content=body).status_code == 202
    found = wait_for(lambda: findings(http, "nan", kind="non_finite"))
    origin = [f for f in found if f["evidence"].get("role") == "origin"]
    assert origin and origin[0]["step"] == 300 and origin[0]["ranks"] == [5] and origin[0]["hosts"] == ["node1"]
    assert origin[0]["severity"] == "critical"
    summary = http.get("/v1/runs/nan").json()
    assert summary["health"] == "critical"
    assert any(f["kind"] == "non_finite" for f in summary["active_findings"])


def straggler_run():
    return simulate_run(n_steps=600, n_ranks=16, seed=11, faults=[Straggler(step=200, rank=7, factor=1.5)])


def straggler_findings(http, run_id):
    found = wait_for(lambda: findings(http, run_id, kind="straggler", status="firing"))
    return [(f["step"], f["ranks"]) for f in found]


def test_detector_state_survives_a_crash_without_repeating_findings(tmp_path):
    run = straggler_run()
    bodies = list(column_pushes(run.block))
    # Reference: one uninterrupted service.
    with ServerProcess(tmp_path / "ref.db") as server, httpx.Client(base_url=server.url, headers={"content-type": "application/json"}) as http:
        http.put("/v1/runs/s", json={"world_size": 16})
        for body in bodies:
            http.post("/v1/runs/s/metrics", content=body)
        reference = straggler_findings(http, "s")
    assert reference and reference[0][1] == [7] and 200 <= reference[0][0] <= 250

    # The same pushes with a SIGKILL in the middle of the straggler episode.
    server = ServerProcess(tmp_path / "crash.db").start()
    try:
        with httpx.Client(base_url=server.url, headers={"content-type": "application/json"}) as http:
            http.put("/v1/runs/s", json={"world_size": 16})
            half = len(bodies) * 2 // 5
            for body in bodies[:half]:
                http.post("/v1/runs/s/metrics", content=body)
            time.sleep(1.5)
            server.kill()
            server.start()
            for body in bodies[half:]:
                http.post("/v1/runs/s/metrics", content=body)
            assert straggler_findings(http, "s") == reference
            all_found = findings(http, "s")
            keys = [(f["kind"], f["metric"], tuple(f["ranks"]), f["step"], f["status"]) for f in all_found]
            assert len(keys) == len(set(keys)), "a finding was stored twice"
    finally:
        server.stop()


def test_new_attempt_restarts_detection(http):
    run = simulate_run(n_steps=300, n_ranks=8, seed=5, faults=[NonFinite(step=250, rank=2)])
    http.put("/v1/runs/att", json={"world_size": 8})
    for body in column_pushes(run.block):
        http.post("/v1/runs/att/metrics", content=body)
    first = wait_for(lambda: findings(http, "att", kind="non_finite"))
    assert {f["attempt"] for f in first} == {1}
    # Roll back to step 200 and train again (slightly different numbers, as real reruns give):
    # the NaN is found again, in attempt 2. (A byte-identical body would be taken for a retry.)
    resumed = run.block.slice_steps(200, 300)
    resumed.values["loss"] = resumed.values["loss"] * (1 + 1e-9)
    for body in column_pushes(resumed):
        assert http.post("/v1/runs/att/metrics", content=body).json()["attempt"] == 2
    again = wait_for(lambda: [f for f in findings(http, "att", kind="non_finite") if f["attempt"] == 2])
    assert again and min(f["step"] for f in again) == 250


def test_hang_from_silence_and_finish_is_not_a_stall(tmp_path):
    env = {"HEALTHSVC_TICK_INTERVAL_S": "0.2"}
    with ServerProcess(tmp_path / "hang.db", env=env) as server, httpx.Client(base_url=server.url, headers={"content-type": "application/json"}) as http:
        http.put("/v1/runs/h", json={"world_size": 4, "detectors": {"hang": {"timeout_floor_s": 1.0}}})
        step = 0
        t_end = time.monotonic() + 6.0
        stopped_at = None
        while time.monotonic() < t_end:
            ranks = range(4) if time.monotonic() < t_end - 4.0 else range(3)  # rank 3 goes silent
            if len(ranks) == 3 and stopped_at is None:
                stopped_at = step
            http.post("/v1/runs/h/metrics", json={"records": [{"step": step, "rank": r, "loss": 1.0} for r in ranks]})
            step += 1
            time.sleep(0.05)
        hangs = wait_for(lambda: findings(http, "h", kind="hang"), timeout_s=5)
        assert [f["ranks"] for f in hangs if f["status"] == "firing"] == [[3]]
        assert findings(http, "h", kind="stall") == []
        # A finished run's silence is neither a hang nor a stall.
        http.post("/v1/runs/h/finish")
        time.sleep(2.5)
        assert findings(http, "h", kind="stall") == []


def test_a_rank_stuck_outside_the_collective_is_named_within_20_s_of_the_last_metrics(http):
    # Default settings (1 s ticker) and detector defaults: 4 ranks step every 0.1 s with 1 Hz
    # heartbeats; then rank 1 stops in step 41 outside the collective while ranks 0, 2 and 3 wait
    # inside it. Their heartbeats keep coming; no metrics do.
    http.put("/v1/runs/c", json={"world_size": 4})

    def beat(step, phase_of):
        for r in range(4):
            assert http.post("/v1/runs/c/heartbeats",
                             json={"rank": r, "step": step, "phase": phase_of(r)}).status_code < 300

    last_beat = 0.0
    for step in range(1, 41):
        resp = http.post("/v1/runs/c/metrics",
                         json={"records": [{"step": step, "rank": r, "loss": 1.0} for r in range(4)]})
        assert resp.status_code < 300
        if time.monotonic() - last_beat >= 1.0:
            beat(step + 1, lambda r: "compute")
            last_beat = time.monotonic()
        time.sleep(0.1)
    last_metrics = time.monotonic()
    hangs: list = []
    while time.monotonic() - last_metrics < 40.0 and not hangs:
        if time.monotonic() - last_beat >= 1.0:
            beat(41, lambda r: "compute" if r == 1 else "collective")
            last_beat = time.monotonic()
        hangs = [f for f in findings(http, "c", kind="hang") if f["status"] == "firing"]
        time.sleep(0.2)
    delay = time.monotonic() - last_metrics
    assert [f["ranks"] for f in hangs] == [[1]], hangs
    assert 9.0 <= delay <= 20.0, delay   # not before collective_wait_s (10 s); within 20 s
    ev = hangs[0]["evidence"]
    assert ev["trigger"] == "collective_wait" and ev["phase"] == "compute"
    assert "peers waiting in the collective at step 41" in ev["reason"]
    assert "rank 1 in phase 'compute' at step 41" in ev["reason"]
    stalls = findings(http, "c", kind="stall")
    assert [(f["status"], f["evidence"]["culprits"]) for f in stalls] == [("firing", [1])]


def test_aligner_waits_for_all_ranks_then_times_out():
    al = StepAligner(timeout_s=2.0, min_block_steps=1)

    def batch(step, ranks):
        ranks = np.asarray(ranks)
        return MetricBatch(steps=np.full(len(ranks), step), ranks=ranks,
                           values={"loss": np.ones(len(ranks))}, present={"loss": np.ones(len(ranks), bool)})

    assert al.add(batch(0, [0, 1]), now=0.0, expected_ranks=3) == []
    blocks = al.add(batch(0, [2]), now=0.1, expected_ranks=3)
    assert [b.steps.tolist() for b in blocks] == [[0]] and blocks[0].ranks.tolist() == [0, 1, 2]
    assert al.add(batch(1, [0, 2]), now=0.2, expected_ranks=3) == []
    assert al.flush_due(now=1.0, expected_ranks=3) == []
    (late,) = al.flush_due(now=2.3, expected_ranks=3)  # rank 1 never came: masked, not zero
    assert late.ranks.tolist() == [0, 2] and late.present["loss"].all()
    assert al.add(batch(1, [1]), now=2.4, expected_ranks=3) == [] and al.late_records == 1


def test_aligner_state_round_trip_keeps_nan_apart_from_missing():
    import json as _json
    al = StepAligner(timeout_s=10.0)
    b = MetricBatch(steps=np.array([5, 5]), ranks=np.array([0, 1]),
                    values={"loss": np.array([np.nan, np.nan])}, present={"loss": np.array([True, False])})
    al.add(b, now=0.0, expected_ranks=4)
    state = _json.loads(_json.dumps(al.state_dict(), allow_nan=True))
    other = StepAligner(timeout_s=10.0)
    other.load_state_dict(state)
    (block,) = other.flush_all()
    assert block.present["loss"].tolist() == [[True, False]] and np.isnan(block.values["loss"][0, 0])


def test_non_finite_evidence_is_stored_as_strings_not_null(tmp_path):
    from detectors.finding import Finding
    from healthsvc.findings import FindingsService
    from healthsvc.store.sqlite import SQLiteStore
    store = SQLiteStore(str(tmp_path / "f.db"))
    service = FindingsService(store, clock=lambda: 1.0)
    store.open()
    try:
        f = Finding(kind="non_finite", step=3, ranks=(1,), severity="critical", score=1.0, metric="loss",
                    evidence={"value": float("nan"), "peak": float("-inf"), "per_rank": [1.5, float("inf")]})
        (stored,) = service.record("r", 1, [f], {1: "node0"}).result(10).findings
        (back,) = service.query("r")
        assert back.finding.evidence == {"value": "NaN", "peak": "-Infinity", "per_rank": [1.5, "Infinity"]}
        assert back.hosts == ("node0",) and back.id == stored.id
    finally:
        store.close()


def test_service_downtime_is_not_the_ranks_silence(tmp_path):
    env = {"HEALTHSVC_TICK_INTERVAL_S": "0.2", "HEALTHSVC_SNAPSHOT_EVERY_S": "0.5"}
    server = ServerProcess(tmp_path / "down.db", env=env).start()
    try:
        with httpx.Client(base_url=server.url, headers={"content-type": "application/json"}) as http:
            http.put("/v1/runs/d", json={"world_size": 2, "detectors": {"hang": {"timeout_floor_s": 1.0}}})

            def push(step):
                http.post("/v1/runs/d/metrics", json={"records": [{"step": step, "rank": r, "loss": 1.0}
                                                                  for r in range(2)]})
            for step in range(40):  # 2 s of pushes: snapshots land meanwhile
                push(step)
                time.sleep(0.05)
            server.kill()           # right after the last push: the ranks were not silent
            time.sleep(3.0)       # the service is down for 3x the hang timeout
            server.start()
            time.sleep(0.5)         # a few ticks before the ranks are heard again (< the timeout)
            for step in range(40, 80):
                push(step)
                time.sleep(0.05)
            time.sleep(0.5)
            assert findings(http, "d", kind="stall") == [] and findings(http, "d", kind="hang") == []
    finally:
        server.stop()


def test_batch_to_block_fast_path_equals_the_general_scatter():
    from healthsvc.monitor.aligner import batch_to_block
    rng = np.random.default_rng(0)
    ranks = np.arange(0, 64, 2)
    values = {"loss": rng.standard_normal(len(ranks))}
    values["loss"][3] = np.nan
    present = {"loss": rng.random(len(ranks)) > 0.2}
    fast = batch_to_block(np.full(len(ranks), 7), ranks, values, present)
    shuffled = rng.permutation(len(ranks))   # same records, out of order: the general path
    slow = batch_to_block(np.full(len(ranks), 7), ranks[shuffled], {"loss": values["loss"][shuffled]},
                          {"loss": present["loss"][shuffled]})
    assert fast.steps.tolist() == slow.steps.tolist() == [7]
    assert fast.ranks.tolist() == slow.ranks.tolist()
    assert np.array_equal(fast.present["loss"], slow.present["loss"])
    assert np.array_equal(fast.values["loss"], slow.values["loss"], equal_nan=True)
