"""Detection inside the service: findings with ranks and hosts, state that survives a crash
without repeating findings, attempts restarting detection, and hangs from the server's clock.

The service runs in process on a fake clock (``tests/harness.py``) with its default settings:
time passes only when a test advances it, and every assertion, of absence above all, follows a
drain. One test crashes a real server process with SIGKILL."""
from __future__ import annotations

import json
import sqlite3

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.both_stores

from simulation import NonFinite, Straggler, simulate_run
from healthsvc.monitor.aligner import StepAligner
from healthsvc.store.batch import MetricBatch
from healthsvc.settings import Settings
from tests.barriers import wait_until
from tests.harness import InProcessService
from tests.server_process import ServerProcess

# How long the aligner may hold a step for missing ranks: after it, every pushed step has been seen.
ALIGN_S = Settings().align_timeout_s


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


@pytest.fixture
def svc(tmp_path, db_uri):
    with InProcessService(tmp_path, db=db_uri) as service:
        yield service


def test_nan_origin_rank_and_host(svc):
    http = svc.http
    run = simulate_run(n_steps=400, n_ranks=16, seed=3, faults=[NonFinite(step=300, rank=5)])
    hosts = {r: f"node{r // 4}" for r in range(16)}
    http.put("/v1/runs/nan", json={"world_size": 16})
    for body in column_pushes(run.block, hosts):
        assert http.post("/v1/runs/nan/metrics", content=body).status_code == 202
    svc.drain()
    found = findings(http, "nan", kind="non_finite")
    origin = [f for f in found if f["evidence"].get("role") == "origin"]
    assert origin and origin[0]["step"] == 300 and origin[0]["ranks"] == [5] and origin[0]["hosts"] == ["node1"]
    assert origin[0]["severity"] == "critical"
    summary = http.get("/v1/runs/nan").json()
    assert summary["health"] == "critical"
    assert any(f["kind"] == "non_finite" for f in summary["active_findings"])


def straggler_run():
    return simulate_run(n_steps=600, n_ranks=16, seed=11, faults=[Straggler(step=200, rank=7, factor=1.5)])


def straggler_findings(http, run_id):
    return [(f["step"], f["ranks"]) for f in findings(http, run_id, kind="straggler", status="firing")]


def settled_findings(tmp_path, db):
    """What a service on ``db`` holds once every stored push has been seen: (stragglers, all)."""
    with InProcessService(tmp_path, db=db) as svc:
        svc.advance(ALIGN_S)
        return straggler_findings(svc.http, "s"), findings(svc.http, "s")


def test_detector_state_survives_a_crash_without_repeating_findings(tmp_path):
    run = straggler_run()
    bodies = list(column_pushes(run.block))
    # Reference: one uninterrupted service.
    with InProcessService(tmp_path, db=tmp_path / "ref.db") as svc:
        svc.http.put("/v1/runs/s", json={"world_size": 16})
        for body in bodies:
            svc.http.post("/v1/runs/s/metrics", content=body)
        svc.advance(ALIGN_S)
        reference = straggler_findings(svc.http, "s")
    assert reference and reference[0][1] == [7] and 200 <= reference[0][0] <= 250

    # The same pushes to a real server process, SIGKILLed in the middle of the straggler episode
    # once its detectors' state is in a snapshot.
    db = tmp_path / "crash.db"
    server = ServerProcess(db).start()
    try:
        with httpx.Client(base_url=server.url, headers={"content-type": "application/json"}) as http:
            http.put("/v1/runs/s", json={"world_size": 16})
            half = len(bodies) * 2 // 5
            for body in bodies[:half]:
                http.post("/v1/runs/s/metrics", content=body)

            def snapshot_taken():
                with sqlite3.connect(db) as conn:
                    return conn.execute("SELECT 1 FROM run_state WHERE run_id='s' AND kind='monitor'").fetchone()
            wait_until(snapshot_taken, what="the monitor's first snapshot of run s")
            server.kill()
            server.start()
            for body in bodies[half:]:
                http.post("/v1/runs/s/metrics", content=body)
    finally:
        server.stop()   # SIGTERM: what was queued is processed before it exits
    stragglers, all_found = settled_findings(tmp_path, db)
    assert stragglers == reference
    keys = [(f["kind"], f["metric"], tuple(f["ranks"]), f["step"], f["status"]) for f in all_found]
    assert len(keys) == len(set(keys)), "a finding was stored twice"


def test_new_attempt_restarts_detection(svc):
    http = svc.http
    run = simulate_run(n_steps=300, n_ranks=8, seed=5, faults=[NonFinite(step=250, rank=2)])
    http.put("/v1/runs/att", json={"world_size": 8})
    for body in column_pushes(run.block):
        http.post("/v1/runs/att/metrics", content=body)
    svc.drain()
    first = findings(http, "att", kind="non_finite")
    assert first and {f["attempt"] for f in first} == {1}
    # Roll back to step 200 and train again (slightly different numbers, as real reruns give):
    # the NaN is found again, in attempt 2. (A byte-identical body would be taken for a retry.)
    resumed = run.block.slice_steps(200, 300)
    resumed.values["loss"] = resumed.values["loss"] * (1 + 1e-9)
    for body in column_pushes(resumed):
        assert http.post("/v1/runs/att/metrics", content=body).json()["attempt"] == 2
    svc.drain()
    again = [f for f in findings(http, "att", kind="non_finite") if f["attempt"] == 2]
    assert again and min(f["step"] for f in again) == 250


def push_step(http, run, step, ranks):
    resp = http.post(f"/v1/runs/{run}/metrics", json={"records": [{"step": step, "rank": r, "loss": 1.0} for r in ranks]})
    assert resp.status_code < 300, resp.text


def test_hang_from_silence_and_finish_is_not_a_stall(svc):
    # Default detectors: a rank that stepped every second hangs after the 60 s floor of silence.
    http = svc.http
    http.put("/v1/runs/h", json={"world_size": 4})
    for step in range(30):
        push_step(http, "h", step, range(4))
        svc.advance(1.0)
    for step in range(30, 30 + 90):   # rank 3 goes silent; the others carry on
        push_step(http, "h", step, range(3))
        svc.advance(1.0)
    hangs = findings(http, "h", kind="hang")
    assert [f["ranks"] for f in hangs if f["status"] == "firing"] == [[3]]
    assert findings(http, "h", kind="stall") == []
    # A finished run's silence is neither a hang nor a stall, however long it lasts.
    assert http.post("/v1/runs/h/finish").status_code < 300
    svc.drain()
    svc.advance(3600.0, step_s=10.0)
    assert findings(http, "h", kind="stall") == []


def test_a_rank_that_left_is_not_hung_however_long_it_stays_away(svc):
    # Default detectors (60 s hang floor): 4 ranks step every second; rank 3 dies after step 29 and
    # the job goes on with 3 ranks (a world_size_change event) for three times the hang timeout.
    # The same silence without the event is a hang (test_hang_from_silence_and_finish_is_not_a_stall).
    http = svc.http
    http.put("/v1/runs/leave", json={"world_size": 4})
    for step in range(30):
        push_step(http, "leave", step, range(4))
        svc.advance(1.0)
    svc.advance(5.0)   # the elastic restart
    assert http.post("/v1/runs/leave/events", json={"kind": "world_size_change", "step": 30,
                                                    "data": {"old": 4, "new": 3}}).status_code == 201
    for step in range(30, 30 + 180):
        push_step(http, "leave", step, range(3))
        svc.advance(1.0)
    found = findings(http, "leave")
    assert not [f for f in found if f["kind"] == "hang" and 3 in f["ranks"]], found
    assert not [f for f in found if f["kind"] in ("hang", "stall") and f["status"] == "firing"], found


def test_a_rank_stuck_outside_the_collective_is_named_within_20_s_of_the_last_metrics(svc):
    # Default settings (1 s ticks) and detector defaults: 4 ranks step every 0.1 s with 1 Hz
    # heartbeats; then rank 1 stops in step 41 outside the collective while ranks 0, 2 and 3 wait
    # inside it. Their heartbeats keep coming; no metrics do.
    http = svc.http
    http.put("/v1/runs/c", json={"world_size": 4})

    def beat(step, phase_of):
        for r in range(4):
            assert http.post("/v1/runs/c/heartbeats",
                             json={"rank": r, "step": step, "phase": phase_of(r)}).status_code < 300

    clock = svc.clock
    last_beat = None
    for step in range(1, 41):
        push_step(http, "c", step, range(4))
        if last_beat is None or clock() - last_beat >= 1.0 - 1e-9:
            beat(step + 1, lambda r: "compute")
            last_beat = clock()
        svc.advance(0.1, step_s=0.1)
    last_metrics = clock()
    hangs: list = []
    while clock() - last_metrics < 40.0 and not hangs:
        if clock() - last_beat >= 1.0 - 1e-9:
            beat(41, lambda r: "compute" if r == 1 else "collective")
            last_beat = clock()
        svc.advance(0.2, step_s=0.2)
        hangs = [f for f in findings(http, "c", kind="hang") if f["status"] == "firing"]
    delay = clock() - last_metrics
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
    from healthsvc_detectors.finding import Finding
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
    # Default detectors: ranks stepping every 0.05 s hang after the 60 s floor of silence. The
    # service crashes right after the last push and is down for 3 minutes.
    timeout_s = 60.0

    def push_steps(svc, steps):
        for step in steps:
            push_step(svc.http, "d", step, range(2))
            svc.advance(0.05, step_s=0.05)

    with InProcessService(tmp_path, db=tmp_path / "before.db") as svc:
        svc.http.put("/v1/runs/d", json={"world_size": 2})
        push_steps(svc, range(40))   # 2 s of pushes: a snapshot lands meanwhile
        crashed = svc.crash_image(tmp_path / "after.db")   # right after the last push
        clock = svc.clock
    clock.advance(3 * timeout_s)     # the service is down for 3x the hang timeout
    with InProcessService(tmp_path, db=crashed, clock=clock) as svc:
        svc.advance(timeout_s / 2)   # ticks before the ranks are heard again (< the timeout)
        push_steps(svc, range(40, 80))
        svc.advance(0.5)
        assert findings(svc.http, "d", kind="stall") == [] and findings(svc.http, "d", kind="hang") == []


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
