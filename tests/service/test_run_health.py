"""Run health has one owner of "what is firing": the findings *and* their alerts' state.

An acknowledged alert keeps its finding active and says who is on it; an alert resolved by hand
or by a rollback past its onset takes its finding out of the run's health, in GET /v1/runs/{id},
the dashboard and /metrics alike. In-process app with its lifespan, real SQLite file.
"""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from healthsvc_detectors.finding import Finding
from healthsvc.app import create_app
from healthsvc.identity import finding_fingerprint
from healthsvc.settings import Settings
from tests.barriers import wait_until

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]


def nan(step: int = 7) -> Finding:
    return Finding("non_finite", step=step, ranks=(0, 1), severity="critical", metric="loss", onset_step=step)


def start(db):
    return create_app(Settings(db=str(db), alert_tick_s=0.05))


def stored_nan(app, c: TestClient, run_id: str, step: int = 7) -> str:
    """Store a NaN finding; returns its alert's fingerprint once alerting has it."""
    app.state.ctx.store.control.submit_run_config(run_id, {}).result()
    app.state.ctx.findings.record(run_id, 1, [nan(step)], {}).result()
    fp = finding_fingerprint(run_id, nan(step))
    wait_until(lambda: c.get("/v1/alerts", params={"run": run_id}).json()["alerts"], what="the alert")
    return fp


def test_an_acknowledged_alert_shows_in_run_health_and_stays_active(db_uri):
    app = start(db_uri)
    with TestClient(app) as c:
        fp = stored_nan(app, c, "r1")
        (active,) = c.get("/v1/runs/r1").json()["active_findings"]
        assert active["alert"] == {"fingerprint": fp, "status": "firing", "acknowledged_at": None,
                                   "acknowledged_by": None}
        assert c.post(f"/v1/alerts/{fp}/acknowledge", json={"by": "alice"}).status_code == 200
        summary = c.get("/v1/runs/r1").json()
        assert summary["health"] == "critical"          # someone is on it; it is not fixed
        (active,) = summary["active_findings"]
        assert active["alert"]["acknowledged_by"] == "alice" and active["alert"]["acknowledged_at"] is not None


def test_an_alert_resolved_by_hand_leaves_run_health_everywhere(db_uri):
    app = start(db_uri)
    with TestClient(app) as c:
        fp = stored_nan(app, c, "r2")
        assert c.get("/v1/runs/r2").json()["health"] == "critical"
        assert c.post(f"/v1/alerts/{fp}/resolve", json={"by": "bob"}).status_code == 200
        summary = c.get("/v1/runs/r2").json()
        assert summary["health"] == "ok" and summary["active_findings"] == []
        assert summary["findings_by_kind"] == {"non_finite": 1}   # history keeps it
        (row,) = [r for r in c.get("/v1/dashboard/runs").json() if r["run_id"] == "r2"]
        assert row["health"] == "ok" and row["active_findings"] == 0


def test_a_rollback_past_the_onset_takes_the_finding_out_of_run_health(db_uri):
    app = start(db_uri)
    with TestClient(app) as c:
        fp = stored_nan(app, c, "r3", step=40)
        assert c.post("/v1/runs/r3/events", json={"kind": "rollback", "step": 30}).status_code == 201
        wait_until(lambda: c.get(f"/v1/alerts/{fp}").json()["status"] == "resolved", what="the rollback to resolve it")
        summary = c.get("/v1/runs/r3").json()
        assert summary["health"] == "ok" and summary["active_findings"] == []


def test_a_finding_after_a_resolution_is_active_again(db_uri):
    app = start(db_uri)
    with TestClient(app) as c:
        fp = stored_nan(app, c, "r4", step=7)
        assert c.post(f"/v1/alerts/{fp}/resolve", json={"by": "bob"}).status_code == 200
        app.state.ctx.findings.record("r4", 1, [nan(9)], {}).result()
        wait_until(lambda: c.get(f"/v1/alerts/{fp}").json()["status"] == "firing", what="the alert to re-open")
        (active,) = c.get("/v1/runs/r4").json()["active_findings"]
        assert active["step"] == 9 and active["alert"]["status"] == "firing"
