"""Through the real server (uvicorn on 127.0.0.1 in process, a fake clock): custom headers and a bearer token go out on every webhook kind (and
are never shown back by the API), PagerDuty events follow the published Events API v2 schema
through trigger, acknowledge and resolve, and links are absolute without HEALTHSVC_EXTERNAL_URL."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest

from healthsvc.alerting.policy import DEFAULT_TIMINGS
from tests.alerting.amschema import ALERTMANAGER_V4
from tests.alerting.receiver import Receiver
from tests.harness import ServedService

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PD_SCHEMA = json.loads((Path(__file__).parent / "pagerduty_event.schema.json").read_text())
ROUTING_KEY = "R0123456789abcdef0123456789abcd"[:31] + "e"   # 32 characters, as PagerDuty issues them
FORMATS = ("json", "alertmanager", "slack", "alertmanager_api", "pagerduty")


def push_nan(c: httpx.Client, run: str) -> None:
    records = [{"step": s, "rank": r, "loss": 2.0} for s in range(5) for r in range(2)]
    records.append({"step": 5, "rank": 0, "loss": "NaN"})
    assert c.post(f"/v1/runs/{run}/metrics", json={"records": records}).status_code == 202


def test_every_kind_sends_headers_and_bearer_and_pagerduty_follows_the_alert(tmp_path):
    with Receiver() as rx:
        subs = [{"id": f, "url": f"http://127.0.0.1:{rx.port}/{f}", "format": f, "secret": "",
                 "headers": {"X-Team": "ml-infra"}, "bearer_token": f"tok-{f}",
                 **({"routing_key": ROUTING_KEY} if f == "pagerduty" else {})} for f in FORMATS]
        with ServedService(tmp_path, alert_webhooks=subs) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            push_nan(c, "pd-run")
            srv.drain()
            got = {r.path.split("/")[1]: r for r in rx.delivered()}
            assert set(got) == set(FORMATS)
            for fmt, r in got.items():
                assert r.headers["authorization"] == f"Bearer tok-{fmt}" and r.headers["x-team"] == "ml-infra"
            assert got["alertmanager_api"].path == "/alertmanager_api/api/v2/alerts"

            # Links are absolute: external_url defaults to the address the service listens on.
            am = json.loads(got["alertmanager"].body)
            jsonschema.validate(am, ALERTMANAGER_V4)
            assert am["externalURL"] == srv.url
            assert am["alerts"][0]["generatorURL"].startswith(srv.url + "/runs/pd-run?")
            assert f"<{srv.url}/runs/pd-run|" in got["slack"].body.decode()
            (posted,) = json.loads(got["alertmanager_api"].body)
            assert posted["generatorURL"].startswith(srv.url + "/")

            trigger = json.loads(got["pagerduty"].body)
            jsonschema.validate(trigger, PD_SCHEMA, format_checker=jsonschema.FormatChecker())
            (alert,) = c.get("/v1/alerts", params={"run": "pd-run"}).json()["alerts"]
            assert trigger["event_action"] == "trigger" and trigger["dedup_key"] == alert["fingerprint"]
            assert trigger["routing_key"] == ROUTING_KEY
            assert trigger["payload"]["severity"] == "critical" and trigger["payload"]["class"] == "non_finite"
            assert trigger["client_url"] == f"{srv.url}/runs/pd-run"   # the dashboard page, not the JSON

            def pd_events() -> list[dict]:
                return [json.loads(r.body) for r in rx.delivered() if r.path == "/pagerduty"]

            fp = alert["fingerprint"]
            assert c.post(f"/v1/alerts/{fp}/acknowledge", json={"by": "alice"}).status_code == 200
            srv.drain()
            assert len(rx.delivered()) >= len(FORMATS) + 1
            assert c.post(f"/v1/alerts/{fp}/resolve", json={"by": "alice"}).status_code == 200
            srv.advance(DEFAULT_TIMINGS["critical"].group_interval_s)   # the group's next flush
            assert [e["event_action"] for e in pd_events()] == ["trigger", "acknowledge", "resolve"]
            for event in pd_events():
                jsonschema.validate(event, PD_SCHEMA)
                assert event["dedup_key"] == fp

            # The API never shows the secrets back.
            for view in c.get("/v1/webhooks").json()["webhooks"]:
                assert view["bearer_token"] == "***" and view["headers"] == {"X-Team": "***"}
                assert view["routing_key"] == ("***" if view["format"] == "pagerduty" else "")
            assert "tok-" not in c.get("/v1/webhooks/json").text and ROUTING_KEY not in c.get("/v1/webhooks").text


def test_api_webhooks_take_headers_and_tokens_keep_them_on_put_and_refuse_bad_ones(server, http):
    r = http.post("/v1/webhooks", json={"id": "pd", "url": "http://127.0.0.1:9/x", "format": "pagerduty",
                                        "routing_key": ROUTING_KEY, "bearer_token": "t0k",
                                        "headers": {"X-Api-Key": "k3y"}})
    assert r.status_code == 201, r.text
    assert (r.json()["bearer_token"], r.json()["headers"], r.json()["routing_key"]) == ("***", {"X-Api-Key": "***"}, "***")
    # PUT without the secrets keeps them (the answer still hides them).
    r = http.put("/v1/webhooks/pd", json={"url": "http://127.0.0.1:9/y", "format": "pagerduty"})
    assert r.status_code == 200 and r.json()["routing_key"] == "***" and r.json()["headers"] == {"X-Api-Key": "***"}
    assert "t0k" not in http.get("/v1/webhooks/pd").text and "k3y" not in http.get("/v1/webhooks").text

    bad = [({"format": "pagerduty"}, "routing_key"),
           ({"headers": {"bad header": "x"}}, "header name"),
           ({"headers": {"Content-Type": "text/plain"}}, "set by the delivery"),
           ({"headers": {"Authorization": "x"}, "bearer_token": "t"}, "set by the delivery"),
           ({"resend_interval_s": 0.1}, "resend_interval_s")]
    for extra, words in bad:
        r = http.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/z", **extra})
        assert r.status_code == 422, (extra, r.text)
        assert words in r.text, (extra, r.text)
