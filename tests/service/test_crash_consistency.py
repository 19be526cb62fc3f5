"""Crash consistency and startup robustness (issue 12, findings 1, 2, 3, 9): a stored config that
no longer validates never stops startup; a failed first push leaves no phantom run; a NaN pushed
just before a crash still becomes an alert (a finding and its alert are stored by one job, so no
crash can leave one without the other)."""
from __future__ import annotations

import json
import sqlite3

import httpx
import pytest

from tests.server_process import ServerProcess
from tests.alerting.receiver import Receiver
from tests.barriers import wait_until


def _nan_push(step: int, ranks: int = 4) -> dict:
    return {"columns": {"step": [step] * ranks, "rank": list(range(ranks)), "loss": ["NaN"] * ranks}}


def _ok_push(step: int, ranks: int = 4) -> dict:
    return {"columns": {"step": [step] * ranks, "rank": list(range(ranks)), "loss": [2.0] * ranks}}


def _wait(predicate, timeout_s: float = 15.0, what: str = "condition"):
    return wait_until(predicate, timeout_s, what, interval_s=0.05)


def _findings(c: httpx.Client, run: str) -> list:
    return c.get(f"/v1/runs/{run}/findings", params={"kind": "non_finite"}).json()


def test_a_stored_config_that_no_longer_validates_does_not_stop_startup(server, http):
    """Finding 1: `critical_ratio: Infinity` was stored as null; the next start exited."""
    for run in ("bad", "worse", "good"):
        assert http.put(f"/v1/runs/{run}", json={"world_size": 4}).status_code == 200
        assert http.post(f"/v1/runs/{run}/metrics", json=_ok_push(0)).status_code == 202
    server.stop()
    with sqlite3.connect(server.db_path) as db:   # what an older version (or a hand) left behind
        db.execute("UPDATE runs SET config=? WHERE run_id='bad'",
                   (json.dumps({"world_size": 4, "detectors": {"straggler": {"critical_ratio": None}}}),))
        db.execute("UPDATE runs SET config=? WHERE run_id='worse'",
                   (json.dumps({"world_size": -3, "hang_timeout_floor_s": "soon", "detectors": []}),))
    server.start()
    assert http.get("/readyz").status_code == 200
    listed = {r["run_id"]: r for r in http.get("/v1/runs").json()}
    assert set(listed) == {"bad", "worse", "good"}
    assert "critical_ratio" in http.get("/v1/runs/bad").json()["config_error"]
    assert http.get("/v1/runs/worse").json()["config_error"]   # the first problem found, in words
    assert http.get("/v1/runs/good").json()["config_error"] is None
    for run in ("bad", "worse", "good"):   # every run is still watched (default detectors)
        assert http.post(f"/v1/runs/{run}/metrics", json=_nan_push(1)).status_code == 202
        _wait(lambda: _findings(http, run), what=f"the NaN finding of {run}")
    # A PUT with a valid config clears the mark.
    assert http.put("/v1/runs/bad", json={"world_size": 4}).status_code == 200
    _wait(lambda: http.get("/v1/runs/bad").json()["config_error"] is None, what="the mark to clear")


def test_a_failed_first_push_leaves_no_phantom_run(server, http):
    """Finding 2: when a run's first push failed, the run stayed in memory while its row was
    rolled back: later pushes answered 202 and the run 404, also after a restart."""
    with sqlite3.connect(server.db_path) as db:   # the store refuses this run's first chunk
        db.execute("CREATE TRIGGER refuse BEFORE INSERT ON chunks WHEN NEW.run_id = 'ph'"
                   " BEGIN SELECT RAISE(ABORT, 'refused by test'); END")
    resp = http.post("/v1/runs/ph/metrics", json=_ok_push(0))
    assert resp.status_code == 503 and resp.json()["detail"][0]["type"] == "store_unavailable", resp.text
    assert http.get("/v1/runs/ph").status_code == 404
    assert "ph" not in {r["run_id"] for r in http.get("/v1/runs").json()}
    with sqlite3.connect(server.db_path) as db:
        db.execute("DROP TRIGGER refuse")
    assert http.post("/v1/runs/ph/metrics", json=_ok_push(1)).status_code == 202
    run = http.get("/v1/runs/ph").json()
    assert (run["attempt"], run["last_step"]) == (1, 1)
    server.kill()
    server.start()
    run = http.get("/v1/runs/ph").json()
    assert (run["attempt"], run["last_step"], run["ranks_seen"]) == (1, 1, 4)


def _alert_env(rx: Receiver) -> dict[str, str]:
    return {"HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "oncall", "url": rx.url, "format": "json"}])}


@pytest.mark.both_stores
def test_sigkill_right_after_a_nan_push_still_delivers_the_alert(db_uri, tmp_path):
    """Finding 3 end to end: push a NaN, SIGKILL at once, restart: the alert reaches a real
    HTTP receiver (here or from the restarted process), for every trial."""
    with Receiver() as rx:
        srv = ServerProcess(db_uri, env=_alert_env(rx), log_path=tmp_path / "k.log")
        try:
            for trial in range(3):
                srv.start()
                with httpx.Client(base_url=srv.url, timeout=30) as c:
                    run = f"k{trial}"
                    assert c.post(f"/v1/runs/{run}/metrics", json=_ok_push(0)).status_code == 202
                    assert c.post(f"/v1/runs/{run}/metrics", json=_nan_push(1)).status_code == 202
                srv.kill()
                srv.start()
                with httpx.Client(base_url=srv.url, timeout=30) as c:
                    _wait(lambda: _findings(c, run), what="the stored finding")
                _wait(lambda: any(f'"{run}"' in r.body.decode() for r in rx.delivered()),
                      what=f"the alert of {run}")
                srv.kill()
        finally:
            srv.stop()
