"""Alerting inside the service (in-process app with its lifespan, real receiver on 127.0.0.1)."""
from __future__ import annotations

import json
import time

import jsonschema
import pytest
from fastapi.testclient import TestClient

from detectors.finding import Finding
from healthsvc.alerting.signing import generate_secret, verify
from healthsvc.app import create_app
from healthsvc.settings import Settings
from tests.alerting.amschema import ALERTMANAGER_V4
from tests.alerting.receiver import Receiver, free_port

pytestmark = pytest.mark.timeout(60)

SECRET = generate_secret()
HOSTS = {r: f"node{r // 8}" for r in range(512)}


def settings(tmp_path, url, **kw):
    return Settings(db=str(tmp_path / "svc.db"), external_url="http://healthsvc.test",
                    alert_webhooks=[{"id": "am", "url": url, "format": "alertmanager", "secret": SECRET}],
                    alert_retry_base_s=0.01, alert_retry_cap_s=0.05, alert_delivery_timeout_s=0.5,
                    alert_tick_s=0.05, **kw)


def record(app, run_id, findings):
    ctx = app.state.ctx
    ctx.store.submit_run_config(run_id, {}).result()
    return ctx.findings.record(run_id, 1, findings, HOSTS).result()


def nan(step=7):
    return Finding("non_finite", step=step, ranks=tuple(range(512)), severity="critical", metric="loss")


def wait_until(pred, timeout_s=10.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


def test_a_stored_finding_pages_once_signed_in_alertmanager_shape(tmp_path):
    with Receiver() as rx:
        app = create_app(settings(tmp_path, rx.url, alert_timings={"critical": {"group_interval_s": 0.5}}))
        with TestClient(app) as c:
            record(app, "r1", [nan(), nan(step=8)])
            (got,) = rx.wait_for(1)
            verify(SECRET, got.headers, got.body, now=time.time())
            body = json.loads(got.body)
            jsonschema.validate(body, ALERTMANAGER_V4)
            assert body["externalURL"] == "http://healthsvc.test" and len(body["alerts"]) == 1
            assert body["alerts"][0]["annotations"]["run_url"] == "http://healthsvc.test/v1/runs/r1"
            time.sleep(0.2)
            assert len(rx.requests) == 1

            alerts = c.get("/v1/alerts", params={"run": "r1"}).json()["alerts"]
            assert [(a["kind"], a["status"], a["inhibited"], a["silenced_by"]) for a in alerts] == [
                ("non_finite", "firing", False, [])]
            assert c.get("/v1/alerts", params={"run": "other"}).json()["alerts"] == []
            fp = alerts[0]["fingerprint"]
            assert c.post(f"/v1/alerts/{fp}/acknowledge", json={"by": "ann"}).json()["acknowledged_by"] == "ann"
            assert c.get("/v1/alerts", params={"acknowledged": "false"}).json()["alerts"] == []

            r = c.post(f"/v1/alerts/{fp}/resolve", json={"by": "ann"})
            assert r.status_code == 200 and r.json()["status"] == "resolved"
            resolved = json.loads(rx.wait_for(2)[1].body)   # after the group interval
            assert resolved["status"] == "resolved"
            assert c.get("/v1/alerts/nope").status_code == 404

            wait_until(lambda: 'healthsvc_webhook_deliveries{state="delivered"} 2.0' in c.get("/metrics").text)
            metrics = c.get("/metrics").text
            assert 'healthsvc_alert_notifications_total{reason="first_notification"} 1.0' in metrics
            assert 'healthsvc_webhook_deliveries{state="delivered"} 2.0' in metrics
            assert 'healthsvc_alerts{severity="critical",status="resolved"} 1.0' in metrics


def test_webhook_crud_and_delivery_status(tmp_path):
    with Receiver() as rx:
        app = create_app(settings(tmp_path, rx.url))
        with TestClient(app) as c:
            r = c.post("/v1/webhooks", json={"id": "slack", "url": rx.url, "format": "slack", "kinds": ["non_finite"]})
            assert r.status_code == 201 and r.json()["secret"].startswith("whsec_")   # shown once
            secret = r.json()["secret"]
            assert c.post("/v1/webhooks", json={"id": "slack", "url": rx.url}).status_code == 409
            listed = {w["id"]: w for w in c.get("/v1/webhooks").json()["webhooks"]}
            assert set(listed) == {"am", "slack"} and listed["slack"]["secret"] == "whsec_***"
            assert c.put("/v1/webhooks/slack", json={"url": rx.url, "format": "slack", "min_severity": "critical"}
                         ).json()["min_severity"] == "critical"
            assert c.delete("/v1/webhooks/am").status_code == 409      # from settings
            assert c.post("/v1/webhooks", json={"url": "ftp://x"}).status_code == 422
            assert c.post("/v1/webhooks", json={"url": rx.url, "kinds": ["nope"]}).status_code == 422

            record(app, "r2", [nan()])
            got = rx.wait_for(2)
            slack = next(g for g in got if "blocks" in json.loads(g.body))
            verify(secret, slack.headers, slack.body, now=time.time())   # the secret was kept by PUT
            wait_until(lambda: c.get("/v1/webhooks/slack/deliveries").json()["counts"]["delivered"] == 1)
            status = c.get("/v1/webhooks/slack/deliveries").json()
            assert status["counts"]["pending"] == 0 and status["deliveries"][0]["state"] == "delivered"
            assert c.delete("/v1/webhooks/slack").json() == {"cancelled": 0}
            assert c.get("/v1/webhooks/slack").status_code == 404


def test_silences_through_the_api(tmp_path):
    with Receiver() as rx:
        app = create_app(settings(tmp_path, rx.url, alert_timings={"critical": {"group_interval_s": 0.5}}))
        with TestClient(app) as c:
            r = c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "r3"}], "duration_s": 3600,
                                             "created_by": "ann", "comment": "maintenance"})
            assert r.status_code == 201 and r.json()["state"] == "active"
            sid = r.json()["id"]
            assert c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "("}], "duration_s": 5,
                                                "op": "=~"}).status_code == 201   # op ignored at top level
            assert c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "(", "op": "=~"}],
                                                "duration_s": 5}).status_code == 422
            assert c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "r"}]}).status_code == 422
            record(app, "r3", [nan()])
            wait_until(lambda: c.get("/v1/alerts", params={"run": "r3"}).json()["alerts"])
            assert c.get("/v1/alerts", params={"run": "r3"}).json()["alerts"][0]["silenced_by"] == [sid]
            time.sleep(0.3)
            assert rx.requests == []
            assert c.delete(f"/v1/silences/{sid}").json()["state"] == "expired"
            rx.wait_for(1)   # the silence ended while the alert still fires: notified now


def test_delivery_resumes_after_a_service_restart(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    app = create_app(settings(tmp_path, url))
    with TestClient(app):
        record(app, "r4", [nan()])
        outbox = app.state.alerting.outbox
        wait_until(lambda: outbox.deliveries() and outbox.deliveries()[0].attempts >= 2)   # receiver down
        (pending,) = outbox.deliveries()
    with Receiver(port=port) as rx:
        app2 = create_app(settings(tmp_path, url))
        with TestClient(app2) as c:
            (got,) = rx.wait_for(1)
            assert got.headers["webhook-id"] == pending.webhook_id
            assert c.get("/v1/webhooks/am/deliveries").json()["counts"]["delivered"] == 1
            assert len(c.get("/v1/alerts").json()["alerts"]) == 1   # the alert survived the restart too
