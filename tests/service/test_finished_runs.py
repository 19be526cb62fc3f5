"""A finished run raises no stall and no hang: input that reaches the monitor after ``finish``
without the run going on leaves it finished (the soak's stalls after finish,
``docs/reliability.md``).

Two ways such input comes: records the store committed before the finish or that fill a gap (the
store keeps the run finished), delivered to the monitor after the finish (a push accepted by
another replica is announced to the owner after a finish that reached the owner directly; a
spool uploaded late), and a rank's last heartbeat arriving after the finish (the store never
resumes a run on a heartbeat). A push the store takes as the run going on still re-opens it: a
hang after it is found.

In process on a fake clock (``tests/harness.py``), both stores (on PostgreSQL with run leases, so
the monitor reads the run's status from the database), default detector settings."""
from __future__ import annotations

import numpy as np
import pytest

from healthsvc.monitor.run_monitor import RunMonitor
from healthsvc.store.batch import MetricBatch
from healthsvc.store.open import open_store
from healthsvc.store.runstate import RunView
from tests.harness import InProcessService

pytestmark = pytest.mark.both_stores

RANKS = 4
QUIET_S = 900.0   # far beyond every default timeout of the hang detector (startup 600 s)


def push(http, run: str, step: int, ranks=range(RANKS)):
    cols = {"step": [step] * len(ranks), "rank": list(ranks), "loss": [1.0] * len(ranks),
            "incarnation": [f"proc-{r}" for r in ranks]}
    r = http.post(f"/v1/runs/{run}/metrics", json={"columns": cols})
    assert r.status_code == 202, r.text


def silence_findings(http, run: str) -> list:
    return [(f["kind"], f["step"], f["ranks"]) for f in http.get(f"/v1/runs/{run}/findings").json()
            if f["kind"] in ("hang", "stall")]


def run_to_finish(svc, run: str, steps: int = 30) -> None:
    http = svc.http
    assert http.put(f"/v1/runs/{run}", json={"world_size": RANKS}).status_code == 200
    for step in range(steps):
        # Rank 3 skips step 12 (its record comes late, below); the others report every step.
        push(http, run, step, [r for r in range(RANKS) if not (r == 3 and step == 12)])
        svc.advance(1.0)
    assert http.post(f"/v1/runs/{run}/finish", json={}).status_code == 200
    svc.drain()


@pytest.fixture
def svc(tmp_path, db_uri):
    with InProcessService(tmp_path, db=db_uri) as service:
        yield service


def test_a_gap_filled_and_a_heartbeat_after_finish_raise_no_stall(svc):
    http = svc.http
    run_to_finish(svc, "late")
    push(http, "late", 12, [3])   # the record rank 3 skipped: a gap filled, not a resume
    assert http.post("/v1/runs/late/heartbeats", json={"rank": 0, "step": 29, "phase": "other"}).status_code == 202
    svc.drain()
    assert http.get("/v1/runs/late").json()["status"] == "finished"
    svc.advance(QUIET_S, step_s=30.0)
    assert silence_findings(http, "late") == []


def test_a_push_that_resumes_a_finished_run_reopens_it(svc):
    http = svc.http
    run_to_finish(svc, "resumed")
    for step in range(30, 130):       # the job goes on, without rank 3 from step 33
        push(http, "resumed", step, range(RANKS) if step < 33 else range(RANKS - 1))
        svc.advance(1.0)
    assert http.get("/v1/runs/resumed").json()["status"] == "running"
    assert [kind for kind, _, ranks in silence_findings(http, "resumed")] == ["hang"]
    assert silence_findings(http, "resumed")[0][2] == [RANKS - 1]


def test_records_another_replica_stored_before_the_finish_and_fed_after_it_raise_no_stall(svc, db_uri):
    """The soak's race, made certain: the job's last step is stored by another replica before the
    finish (here a second store on the same database, which tells nobody), and the owner's
    monitor feeds it only after the finish (at its next tick, which pulls what notifications did
    not bring). Neither replica's view knows both, so the owner asks the database: the run is
    finished. The step is still judged: its NaN is found (the barrier that it was fed)."""
    if not str(db_uri).startswith("postgresql"):
        pytest.skip("a run is fed records stored elsewhere only with replicas (PostgreSQL)")
    http = svc.http
    assert http.put("/v1/runs/raced", json={"world_size": RANKS}).status_code == 200
    for step in range(30):
        push(http, "raced", step)
        svc.advance(1.0)
    elsewhere = open_store(str(db_uri))
    elsewhere.open()
    try:
        loss = np.ones(RANKS)
        loss[1] = np.nan
        last = MetricBatch(np.full(RANKS, 30), np.arange(RANKS), {"loss": loss}, {"loss": np.ones(RANKS, dtype=bool)})
        elsewhere.ingest.submit_metrics("raced", last, "the-last-step").result(10)
    finally:
        elsewhere.close()
    assert http.post("/v1/runs/raced/finish", json={}).status_code == 200
    svc.drain()
    svc.advance(QUIET_S, step_s=30.0)
    found = [(f["kind"], f["step"]) for f in http.get("/v1/runs/raced/findings").json()]
    assert ("non_finite", 30) in found
    assert silence_findings(http, "raced") == []


def batch(step: int) -> MetricBatch:
    ranks = np.arange(RANKS)
    return MetricBatch(np.full(RANKS, step), ranks, {"loss": np.ones(RANKS)}, {"loss": np.ones(RANKS, dtype=bool)})


def test_records_committed_before_the_finish_and_fed_after_it_leave_the_monitor_finished():
    """The owner's order of events with replicas: the last step's records, accepted by another
    replica before the finish, reach the owner's monitor after it (the view says finished: the
    hub read the run's status). Without the finish holding, the ranks' silence after them is a
    stall once the timeouts pass."""
    mon = RunMonitor("r", {"world_size": RANKS})
    for step in range(30):
        mon.on_metrics(batch(step), RunView(1, 0, RANKS, False), step + 1, float(step))
    assert mon.on_finish(30.0) == []
    mon.on_metrics(batch(30), RunView(1, 0, RANKS, True), 31, 30.5)
    assert mon.finished
    assert [f.kind for t in range(31, 2000, 10) for f in mon.tick(float(t))] == []
    # Restored from a snapshot, the finish holds too.
    again = RunMonitor("r", {"world_size": RANKS})
    again.load_state_dict(mon.state_dict())
    assert again.finished and [f.kind for f in again.tick(5000.0)] == []
