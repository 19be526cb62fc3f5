"""Finished runs are let go from memory (the soak's memory growth, ``docs/reliability.md``): a run
that finished and had no input for ``run_release_after_s`` keeps no detector state, no lease,
(replicas) no alerts, no ingest state and no dashboard rollups in memory; its state stays in the
store (reads of it answer as before), and a push after the finish restores it (the detectors go on
from where they were: a hang after it is found).

Counted, not measured: the held per-run entries (``healthsvc.runs.held``, what ``/metrics``
serves as ``healthsvc_runs_held``). In process on a fake clock, both stores (PostgreSQL with run
leases), default detector settings."""
from __future__ import annotations

import pytest

from healthsvc.runs.held import holders
from tests.harness import InProcessService

pytestmark = pytest.mark.both_stores

RANKS = 4
RUNS = 12
RELEASE_S = 60.0
READS = ("/v1/runs/r3", "/v1/runs/r3/dashboard/series", "/v1/runs/r3/dashboard/heatmap")


def push(http, run: str, step: int, ranks=range(RANKS), loss: float = 1.0):
    cols = {"step": [step] * len(ranks), "rank": list(ranks), "loss": [loss] * len(ranks)}
    r = http.post(f"/v1/runs/{run}/metrics", content=__import__("json").dumps({"columns": cols}),
                  headers={"content-type": "application/json"})
    assert r.status_code == 202, r.text


@pytest.fixture
def svc(tmp_path, db_uri):
    with InProcessService(tmp_path, db=db_uri, run_release_after_s=RELEASE_S) as service:
        yield service


def test_finished_quiet_runs_are_let_go_and_restored_when_pushed_again(svc):
    http = svc.http
    for k in range(RUNS):
        run = f"r{k}"
        assert http.put(f"/v1/runs/{run}", json={"world_size": RANKS}).status_code == 200
        for step in range(20):
            push(http, run, step)
        assert http.post(f"/v1/runs/{run}/finish", json={}).status_code == 200
    push(http, "alive", 0)   # a run that goes on is kept
    svc.drain()
    held = holders(svc.app)
    assert held["monitor_monitors"] == held["store_run_states"] == held["dashboard_feeds"] == RUNS + 1
    assert all(http.get(path).status_code == 200 for path in READS)
    before = {path: http.get(path).json() for path in READS}
    assert before[READS[1]]["step_max"] == 19 and "loss" in before[READS[1]]["fields"]
    svc.advance(RELEASE_S / 2)
    push(http, "alive", 1)
    svc.drain()
    assert holders(svc.app)["monitor_monitors"] == RUNS + 1   # not quiet long enough yet
    svc.advance(RELEASE_S)
    push(http, "alive", 2)
    svc.drain()
    held = holders(svc.app)
    assert {k: v for k, v in held.items() if k.startswith("monitor_")} == {
        "monitor_monitors": 1, "monitor_parked": 0, "monitor_fed": int(not svc.monitor.ownership.holds_every_run()),
        "monitor_snapshot_times": 1, "monitor_config_errors": 0, "monitor_unstored": 0}
    assert held["leases"] == (0 if svc.monitor.ownership.holds_every_run() else 1)
    assert held["alerting_runs"] == 0
    assert held["store_run_states"] == held["dashboard_feeds"] == 1
    assert svc.monitor.runs_released == RUNS
    # What a reader sees of a run let go is what it saw before (read back from the store).
    assert {path: http.get(path).json() for path in READS} == before
    assert holders(svc.app)["store_run_states"] == holders(svc.app)["dashboard_feeds"] == 1   # and not kept

    # Pushed again (the job goes on, without rank 3 from step 80): restored, and its detectors go on.
    for step in range(20, 170):
        push(http, "r0", step, range(RANKS - 1) if step >= 80 else range(RANKS))
        svc.advance(1.0)
    assert http.get("/v1/runs/r0").json()["status"] == "running"
    hangs = [(f["kind"], f["ranks"]) for f in http.get("/v1/runs/r0/findings").json() if f["kind"] in ("hang", "stall")]
    assert hangs == [("hang", [RANKS - 1])]
    assert holders(svc.app)["monitor_monitors"] == 2


def test_a_finished_run_whose_alert_still_fires_keeps_its_lease_not_its_detectors(svc):
    """A latched alert (a NaN) fires until someone resolves it: its reminders are the owner's to
    send, so the lease (and with it the run's alerts) stays; the detector state goes."""
    http = svc.http
    assert http.put("/v1/runs/nan", json={"world_size": RANKS}).status_code == 200
    for step in range(20):
        push(http, "nan", step, loss=float("nan") if step == 15 else 1.0)
    assert http.post("/v1/runs/nan/finish", json={}).status_code == 200
    svc.drain()
    assert any(f["kind"] == "non_finite" for f in http.get("/v1/runs/nan/findings").json())
    svc.advance(RELEASE_S + 5)
    held = holders(svc.app)
    assert held["monitor_monitors"] == 0
    if not svc.monitor.ownership.holds_every_run():
        assert held["monitor_parked"] == 1 and held["leases"] == 1 and held["alerting_runs"] == 1


def done_and_going(tmp_path, db_uri) -> None:
    """A service's store left with two runs of 20 steps: "done" finished, "going" running."""
    with InProcessService(tmp_path, db=db_uri, run_release_after_s=RELEASE_S) as svc:
        for run in ("done", "going"):
            assert svc.http.put(f"/v1/runs/{run}", json={"world_size": RANKS}).status_code == 200
            for step in range(20):
                push(svc.http, run, step)
        assert svc.http.post("/v1/runs/done/finish", json={}).status_code == 200
        svc.drain()


def test_a_restart_does_not_bring_finished_runs_back_into_memory(tmp_path, db_uri):
    done_and_going(tmp_path, db_uri)
    with InProcessService(tmp_path, db=db_uri, run_release_after_s=RELEASE_S) as svc:
        svc.drain()
        # A single server restores the running runs only; a replica takes its leases back (its
        # finished runs among them are let go again after the window).
        if svc.monitor.ownership.holds_every_run():
            assert holders(svc.app)["monitor_monitors"] == 1
        svc.advance(RELEASE_S + 15)   # the store loaded every run; a release pass lets "done" go again
        held = holders(svc.app)
        assert held["monitor_monitors"] == 1
        assert held["store_run_states"] == held["dashboard_feeds"] == 1
        push(svc.http, "done", 20)   # pushed again: restored on demand
        svc.drain()
        assert holders(svc.app)["monitor_monitors"] >= 1
        assert svc.http.get("/v1/runs/done").json()["status"] == "running"


def test_a_restart_holds_no_finished_run_in_the_dashboard_and_reads_or_resumes_it_whole(tmp_path, db_uri):
    """The dashboard restores running runs only: a finished one is read back from its snapshot
    (on a replica the store lets go of, and so tells the hub about, only runs it loaded: a
    finished run restored there stayed for good, as the soak found). One with no snapshot yet
    (its process stopped before the first) is rebuilt from its chunks once and its snapshot
    written; pushed to again, a run the hub did not hold comes back with its history."""
    done_and_going(tmp_path, db_uri)
    # Played: the process that folded "done" stopped before writing its dashboard snapshot.
    with InProcessService(tmp_path, db=db_uri, run_release_after_s=RELEASE_S) as svc:
        svc.app.state.ctx.store.write(
            lambda conn: conn.execute("DELETE FROM run_state WHERE run_id='done' AND kind='dashboard'")).result(10)
    with InProcessService(tmp_path, db=db_uri, run_release_after_s=RELEASE_S) as svc:
        svc.drain()
        hub, store = svc.app.state.dashboard, svc.app.state.ctx.store
        assert "done" not in hub.feeds and "going" in hub.feeds
        assert store.snapshot("done", "dashboard") is not None          # rebuilt once, and written
        assert hub.read("done", lambda r: (r.steps_seen, r.last_step)) == (20, 19)
        assert "done" not in hub.feeds                                   # read, not kept
        series = svc.http.get("/v1/runs/done/dashboard/series", params={"fields": "loss"}).json()
        assert series["fields"]["loss"]["steps"] == list(range(20))
        push(svc.http, "done", 20)   # resumed: its rollup comes back whole
        svc.drain()
        svc.http.post("/v1/runs/done/finish", json={})
        svc.drain()
        assert hub.read("done", lambda r: (r.steps_seen, r.last_step)) == (21, 20)
