"""Info never pages, and a resolved finding resolves its alert at the receiver.

Through the real server (uvicorn on 127.0.0.1) and real HTTP receivers: one subscription per body
format, none saying its ``min_severity``, and one loss-spike finding of each severity in a run of
its own. Table-driven over formats x severities: the formats that reach people are sent warning
and critical, never info; ``json`` (a program's feed) is sent all three; a subscription that asks
for info gets it. Then, against a real Alertmanager and a PagerDuty receiver: the alert of a
finding that resolves is resolved there within one re-send interval, long before the group
interval or the alert's own ``endsAt`` would have ended it. And the report itself, through the
real detectors: a one-step x1.6 loss spike that recovers pages nobody."""
from __future__ import annotations

import json
import math
import time

import httpx
import pytest

from healthsvc_detectors.finding import Finding
from healthsvc.alerting.policy import DEFAULT_TIMINGS
from tests.alerting.alertmanager_proc import AlertmanagerProcess
from tests.alerting.receiver import Receiver
from tests.barriers import wait_until
from tests.harness import ServedService

pytestmark = [pytest.mark.timeout(120)]

ROUTING_KEY = "0123456789abcdef0123456789abcdef"   # 32 characters, as PagerDuty issues them
FORMATS = ("alertmanager", "slack", "alertmanager_api", "pagerduty", "json")
PAGING = {"alertmanager", "slack", "alertmanager_api", "pagerduty"}
SEVERITIES = ("info", "warning", "critical")


def subscription(fmt: str, port: int, **extra) -> dict:
    sub = {"id": extra.pop("id", fmt), "url": f"http://127.0.0.1:{port}/{extra.get('path', fmt)}", "format": fmt,
           "secret": ""}
    extra.pop("path", None)
    return {**sub, **({"routing_key": ROUTING_KEY} if fmt == "pagerduty" else {}), **extra}


def runs_in(fmt: str, body: bytes) -> set[str]:
    """The runs a delivered body notifies, read as each receiver reads it."""
    doc = json.loads(body)
    if fmt == "pagerduty":
        return {doc["payload"]["group"]} if doc["event_action"] == "trigger" else set()
    if fmt == "alertmanager_api":
        return {a["labels"]["run"] for a in doc}
    if fmt == "slack":
        return {s for s in (f"sev-{v}" for v in SEVERITIES) if f"run {s}" in doc["text"]}
    return {a["labels"]["run"] for a in doc["alerts"]}


def record(svc, run_id: str, findings: list[Finding]) -> None:
    """Store findings as the monitor does, then wait for all they cause."""
    ctx = svc.app.state.ctx
    ctx.store.control.submit_run_config(run_id, {}).result()
    ctx.findings.record(run_id, 1, findings, {r: f"node{r}" for r in range(8)}).result()
    svc.drain()


def spike(severity: str, status: str = "firing", step: int = 120) -> Finding:
    return Finding("loss_spike", step=step, ranks=(3,), severity=severity, metric="loss", status=status, score=0.5)


@pytest.fixture(scope="module")
def notified(tmp_path_factory) -> dict[str, set[str]]:
    """Subscription id -> the runs it was notified of, after every group's first flush."""
    with Receiver() as rx:
        subs = [subscription(f, rx.port) for f in FORMATS]
        subs.append(subscription("pagerduty", rx.port, id="pd-asks-info", path="pd-asks-info", min_severity="info"))
        with ServedService(tmp_path_factory.mktemp("paging"), alert_webhooks=subs) as srv:
            for severity in SEVERITIES:
                record(srv, f"sev-{severity}", [spike(severity)])
            # Past the longest first wait (info's group_wait): every group has had its first flush.
            srv.advance(DEFAULT_TIMINGS["info"].group_wait_s + 1, step_s=10)
            got: dict[str, set[str]] = {s["id"]: set() for s in subs}
            for r in rx.delivered():
                sub_id = r.path.strip("/").split("/")[0]
                fmt = next(s["format"] for s in subs if s["id"] == sub_id)
                got[sub_id] |= runs_in(fmt, r.body)
            return got


@pytest.mark.parametrize("severity", SEVERITIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_subscription_that_does_not_say_pages_warning_and_critical_never_info(notified, fmt, severity):
    paged = f"sev-{severity}" in notified[fmt]
    expected = severity != "info" or fmt not in PAGING
    assert paged == expected, (fmt, severity, notified[fmt])


def test_a_subscription_that_asks_for_info_gets_it(notified):
    assert notified["pd-asks-info"] == {"sev-info", "sev-warning", "sev-critical"}


def test_the_api_shows_the_default_it_applied(tmp_path):
    with ServedService(tmp_path) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        for fmt in FORMATS:
            extra = {"routing_key": ROUTING_KEY} if fmt == "pagerduty" else {}
            r = c.post("/v1/webhooks", json={"id": fmt, "url": "http://127.0.0.1:9/x", "format": fmt, **extra})
            assert r.status_code == 201, r.text
            assert r.json()["min_severity"] == ("warning" if fmt in PAGING else "info"), fmt
        r = c.put("/v1/webhooks/slack", json={"url": "http://127.0.0.1:9/x", "format": "slack", "min_severity": "info"})
        assert r.json()["min_severity"] == "info"   # said: kept


RESEND_S = 5.0   # a firing alert's endsAt is 4 re-sends (20 s) ahead; the warning group interval is 300 s


def am_active(am: httpx.Client, run: str) -> list[dict]:
    return [a for a in am.get("/api/v2/alerts", params={"active": "true", "silenced": "true"}).json()
            if a["labels"].get("run") == run and a["status"]["state"] == "active"]


def test_a_resolved_finding_resolves_its_alert_at_alertmanager_and_pagerduty_within_a_resend(tmp_path):
    with Receiver() as rx, AlertmanagerProcess(tmp_path, rx.url.replace("/hook", "/from-am"),
                                               resolve_timeout="5m") as am_proc:
        subs = [{"id": "am", "url": am_proc.url, "format": "alertmanager_api", "resend_interval_s": RESEND_S},
                subscription("pagerduty", rx.port, resend_interval_s=RESEND_S)]
        # A warning group's first flush comes after a short wait here (real time on both sides);
        # its group interval stays the default 300 s, which a resolution must not wait for.
        timings = {"warning": {"group_wait_s": 0.5}}
        with ServedService(tmp_path, real_time=True, alert_webhooks=subs, alert_timings=timings) as srv, \
                httpx.Client(base_url=am_proc.url, timeout=10) as am:
            record(srv, "blip", [spike("warning")])
            wait_until(lambda: am_active(am, "blip"), what="the spike's alert active in Alertmanager")
            pd = [json.loads(r.body) for r in rx.wait_for(1) if r.path == "/pagerduty"]
            assert [e["event_action"] for e in pd] == ["trigger"]

            record(srv, "blip", [spike("info", status="resolved", step=121)])   # recovered at the next step
            resolved_at = time.monotonic()
            wait_until(lambda: not am_active(am, "blip"), timeout_s=RESEND_S + 3,
                       what="Alertmanager to resolve the alert within one re-send interval")
            assert time.monotonic() - resolved_at < RESEND_S + 3 < 4 * RESEND_S   # not its endsAt lapsing
            from_am = wait_until(lambda: [json.loads(r.body) for r in rx.delivered()
                                          if r.path == "/from-am" and json.loads(r.body)["status"] == "resolved"],
                                 what="Alertmanager's resolved notification")
            assert from_am[0]["alerts"][0]["labels"]["alertname"] == "loss_spike"
            pd = wait_until(lambda: [json.loads(r.body)["event_action"] for r in rx.delivered() if r.path == "/pagerduty"]
                            [1:], what="PagerDuty's resolve event")
            assert pd == ["resolve"]
            (alert,) = srv.http.get("/v1/alerts", params={"run": "blip"}).json()["alerts"]
            assert (alert["status"], alert["resolved_by"]) == ("resolved", "condition")


def test_a_one_step_loss_spike_that_recovers_pages_nobody_and_its_alert_resolves_at_the_next_step(tmp_path):
    """The report: a x1.6 loss spike at one step, through the real detectors (an info finding,
    resolved at the next step), paged PagerDuty with severity info a minute later and stayed
    firing for the resolve timeout."""
    with Receiver() as rx:
        subs = [subscription(f, rx.port) for f in ("pagerduty", "alertmanager_api", "slack")]
        with ServedService(tmp_path, alert_webhooks=subs) as srv:
            records = [{"step": s, "rank": r, "grad_norm": 1.0, "step_time": 0.5,
                        "loss": (3.0 * math.exp(-s / 400) + 0.005 * ((s * 7 + r * 3) % 5 - 2)) * (1.6 if s == 250 else 1.0)}
                       for s in range(300) for r in range(2)]
            for i in range(0, len(records), 40):
                assert srv.http.post("/v1/runs/blip1/metrics", json={"records": records[i:i + 40]}).status_code == 202
            srv.drain()
            spikes = [(f["step"], f["severity"], f["status"])
                      for f in srv.http.get("/v1/runs/blip1/findings", params={"kind": "loss_spike"}).json()]
            assert spikes == [(250, "info", "firing"), (251, "info", "resolved")]
            (alert,) = srv.http.get("/v1/alerts", params={"run": "blip1"}).json()["alerts"]
            assert (alert["status"], alert["resolved_by"]) == ("resolved", "condition")
            srv.advance(DEFAULT_TIMINGS["info"].group_wait_s + 30, step_s=5)   # past the first flush; drained
            assert rx.requests == []
