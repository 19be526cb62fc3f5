"""``format: "alertmanager_api"`` against a real Alertmanager 0.25 (Debian's package): healthsvc
posts postable alerts to its ``/api/v2/alerts``, Alertmanager routes them to a webhook receiver,
keeps a latched alert firing past its own short ``resolve_timeout`` because healthsvc re-sends it,
and resolves it when healthsvc resolves it."""
from __future__ import annotations

import json
import time

import httpx
import jsonschema
import pytest

from tests.alerting.alertmanager_proc import AlertmanagerProcess
from tests.alerting.amschema import ALERTMANAGER_V4
from tests.alerting.receiver import Receiver
from tests.barriers import wait_until
from tests.harness import ServedService

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

RESEND_S = 1.0   # healthsvc re-sends every second; Alertmanager's resolve_timeout is 2 s




def am_alerts(am: httpx.Client, run: str) -> list[dict]:
    return [a for a in am.get("/api/v2/alerts").json() if a["labels"].get("run") == run]


def test_a_latched_alert_fed_to_alertmanager_stays_firing_then_resolves(tmp_path):
    with Receiver() as rx, AlertmanagerProcess(tmp_path, rx.url, resolve_timeout="2s") as am_proc:
        subs = [{"id": "am", "url": am_proc.url, "format": "alertmanager_api", "pass_through": True,
                 "resend_interval_s": RESEND_S}]
        # Real time on both sides: Alertmanager's resolve_timeout runs on its own clock.
        with ServedService(tmp_path, real_time=True, alert_webhooks=subs) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as c, \
                httpx.Client(base_url=am_proc.url, timeout=10) as am:
            records = [{"step": s, "rank": r, "loss": 2.0, "grad_norm": 1.0} for s in range(10) for r in range(2)]
            records.append({"step": 10, "rank": 1, "loss": "NaN", "grad_norm": 1.0})
            assert c.post("/v1/runs/amrun/metrics", json={"records": records}).status_code == 202

            (alert,) = wait_until(lambda: am_alerts(am, "amrun"), what="the alert in Alertmanager")
            assert alert["labels"]["alertname"] == "non_finite" and alert["labels"]["severity"] == "critical"
            assert alert["status"]["state"] == "active"
            assert alert["generatorURL"].startswith(f"{srv.url}/runs/amrun?kind=non_finite&step=")
            assert alert["annotations"]["run_url"] == f"{srv.url}/runs/amrun"   # the dashboard page

            # Routed by Alertmanager to its receiver, in its own v4 webhook body.
            first = json.loads(rx.wait_for(1)[0].body)
            jsonschema.validate(first, ALERTMANAGER_V4)
            assert first["status"] == "firing" and first["alerts"][0]["labels"]["run"] == "amrun"

            # Barrier: healthsvc re-sent the alert for well past Alertmanager's resolve_timeout (2 s)
            # and past the endsAt of its first post (4 re-send intervals).
            fp = c.get("/v1/alerts", params={"run": "amrun"}).json()["alerts"][0]["fingerprint"]
            first_post = time.monotonic()
            wait_until(lambda: len(delivered(c)) >= 7, timeout_s=30, what="7 deliveries to Alertmanager")
            assert time.monotonic() - first_post > 4 * RESEND_S
            assert {d["reason"] for d in delivered(c)} == {"first_notification", "resend_interval_elapsed"}
            (still,) = am_alerts(am, "amrun")
            assert still["status"]["state"] == "active" and still["fingerprint"]
            assert all(json.loads(r.body)["status"] == "firing" for r in rx.delivered())

            assert c.post(f"/v1/alerts/{fp}/resolve", json={"by": "test"}).status_code == 200
            wait_until(lambda: not am_alerts(am, "amrun"), what="Alertmanager to drop the resolved alert")
            resolved = wait_until(lambda: [json.loads(r.body) for r in rx.delivered()
                                           if json.loads(r.body)["status"] == "resolved"],
                                  what="the resolved notification from Alertmanager")
            assert resolved[0]["alerts"][0]["labels"]["alertname"] == "non_finite"
            assert resolved[0]["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
            srv.drain()
            n = len(delivered(c))
            srv.advance(2 * RESEND_S + 1.5)   # resends, if any, would go out at this tick
            assert len(delivered(c)) == n


def delivered(c: httpx.Client) -> list[dict]:
    body = c.get("/v1/webhooks/am/deliveries", params={"state": "delivered"}).json()
    return body["deliveries"]
