"""Alerting inside the service (in-process app with its lifespan on a fake clock, real receiver
on 127.0.0.1, default alert timings). Every assertion follows a drain: what is not there by then
was never going to be sent."""
from __future__ import annotations

import json
import threading
import time

import jsonschema
import pytest

from healthsvc_detectors.finding import Finding
from healthsvc.alerting.policy import DEFAULT_TIMINGS
from healthsvc.alerting.signing import generate_secret, verify
from healthsvc.drain import DrainTimeout
from tests.alerting.amschema import ALERTMANAGER_V4
from tests.alerting.receiver import Receiver, free_port
from tests.harness import InProcessService

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]

SECRET = generate_secret()
HOSTS = {r: f"node{r // 8}" for r in range(512)}
CRITICAL = DEFAULT_TIMINGS["critical"]


def service(tmp_path, db_uri, url, **kw):
    return InProcessService(tmp_path, db=db_uri, external_url="http://healthsvc.test",
                            alert_webhooks=[{"id": "am", "url": url, "format": "alertmanager", "secret": SECRET}],
                            **kw)


def record(svc, run_id, findings):
    """Store findings as the monitor does, then wait for all they cause (alerts, deliveries)."""
    ctx = svc.app.state.ctx
    ctx.store.control.submit_run_config(run_id, {}).result()
    stored = ctx.findings.record(run_id, 1, findings, HOSTS).result()
    svc.drain()
    return stored


def nan(step=7):
    return Finding("non_finite", step=step, ranks=tuple(range(512)), severity="critical", metric="loss")


def test_a_stored_finding_pages_once_signed_in_alertmanager_shape(tmp_path, db_uri):
    with Receiver() as rx, service(tmp_path, db_uri, rx.url) as svc:
        c = svc.http
        record(svc, "r1", [nan(), nan(step=8)])
        (got,) = rx.delivered()   # critical: group_wait 0, so sent at once; and only once
        verify(SECRET, got.headers, got.body, now=time.time())
        body = json.loads(got.body)
        jsonschema.validate(body, ALERTMANAGER_V4)
        assert body["externalURL"] == "http://healthsvc.test" and len(body["alerts"]) == 1
        assert body["alerts"][0]["annotations"]["run_url"] == "http://healthsvc.test/runs/r1"
        svc.advance(1.0)   # a tick later: nothing new to say
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
        svc.advance(CRITICAL.group_interval_s - 2)   # 9 s after the page
        assert len(rx.requests) == 1   # the resolution waits for the group interval ...
        svc.advance(2.0)
        resolved = json.loads(rx.delivered()[1].body)   # ... and goes out when it has passed
        assert resolved["status"] == "resolved"
        assert c.get("/v1/alerts/nope").status_code == 404

        metrics = c.get("/metrics").text
        assert 'healthsvc_alert_notifications_total{reason="first_notification"} 1.0' in metrics
        assert 'healthsvc_webhook_deliveries{state="delivered"} 2.0' in metrics
        assert 'healthsvc_alerts{severity="critical",status="resolved"} 1.0' in metrics


def test_webhook_crud_and_delivery_status(tmp_path, db_uri):
    with Receiver() as rx, service(tmp_path, db_uri, rx.url) as svc:
        c = svc.http
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

        record(svc, "r2", [nan()])
        got = rx.delivered()
        assert len(got) == 2   # one per subscription
        slack = next(g for g in got if "blocks" in json.loads(g.body))
        verify(secret, slack.headers, slack.body, now=time.time())   # the secret was kept by PUT
        status = c.get("/v1/webhooks/slack/deliveries").json()
        assert status["counts"]["delivered"] == 1
        assert status["counts"]["pending"] == 0 and status["deliveries"][0]["state"] == "delivered"
        assert c.delete("/v1/webhooks/slack").json() == {"cancelled": 0}
        assert c.get("/v1/webhooks/slack").status_code == 404


def test_silences_through_the_api(tmp_path, db_uri):
    with Receiver() as rx, service(tmp_path, db_uri, rx.url) as svc:
        c = svc.http
        r = c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "r3"}], "duration_s": 3600,
                                         "created_by": "ann", "comment": "maintenance"})
        assert r.status_code == 201 and r.json()["state"] == "active"
        sid = r.json()["id"]
        assert c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "("}], "duration_s": 5,
                                            "op": "=~"}).status_code == 201   # op ignored at top level
        assert c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "(", "op": "=~"}],
                                            "duration_s": 5}).status_code == 422
        assert c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "r"}]}).status_code == 422
        record(svc, "r3", [nan()])
        assert c.get("/v1/alerts", params={"run": "r3"}).json()["alerts"][0]["silenced_by"] == [sid]
        svc.advance(CRITICAL.group_interval_s)   # silenced through a group interval: still nothing
        assert rx.requests == []
        assert c.delete(f"/v1/silences/{sid}").json()["state"] == "expired"
        # The silence ended while the alert still fires: notified at the group's next flush.
        svc.advance(CRITICAL.group_interval_s)
        assert len(rx.delivered()) == 1


def test_delivery_resumes_after_a_service_restart(tmp_path, db_uri):
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    with service(tmp_path, db_uri, url) as svc:
        record(svc, "r4", [nan()])                     # receiver down: the first attempt fails
        svc.advance(svc.settings.alert_retry_cap_s)    # the longest backoff: a retry fails too
        outbox = svc.alerting.outbox
        (pending,) = outbox.deliveries()
        assert pending.state == "pending" and pending.attempts >= 2
    with Receiver(port=port) as rx, service(tmp_path, db_uri, url, clock=svc.clock) as svc2:
        svc2.advance(svc2.settings.alert_retry_cap_s)  # the retry falls due in the new process
        (got,) = rx.delivered()
        assert got.headers["webhook-id"] == pending.webhook_id
        c = svc2.http
        assert c.get("/v1/webhooks/am/deliveries").json()["counts"]["delivered"] == 1
        assert len(c.get("/v1/alerts").json()["alerts"]) == 1   # the alert survived the restart too


def test_drain_waits_for_a_delivery_in_flight_and_names_the_stage_behind(tmp_path, db_uri):
    with Receiver(script=[("sleep", 1.0)]) as rx, service(tmp_path, db_uri, rx.url) as svc:
        ctx = svc.app.state.ctx
        ctx.store.control.submit_run_config("r5", {}).result()
        ctx.findings.record("r5", 1, [nan()], HOSTS).result()
        with pytest.raises(DrainTimeout, match="webhook delivery worker"):
            svc.drain(timeout_s=0.5)    # the receiver takes a second to answer
        svc.drain()
        assert len(rx.delivered()) == 1


def hang(rank=3, step=50):
    return Finding("hang", step=step, ranks=(rank,), severity="critical")


def test_a_finding_its_alert_and_its_notification_commit_in_one_job(tmp_path, db_uri):
    # No drain: the job that stores the finding has, when it is durable, also stored its alert
    # and the notification (critical: group_wait 0), in the same transaction.
    with Receiver() as rx, service(tmp_path, db_uri, rx.url) as svc:
        ctx = svc.app.state.ctx
        ctx.store.control.submit_run_config("r1", {}).result()
        # Hold the run's owner (the monitor thread, in its alerts' tick): nothing below may
        # depend on it.
        held, holding = threading.Event(), threading.Event()
        real_tick = ctx.alerting.tick
        ctx.alerting.tick = lambda now, asked=False: (holding.set(), held.wait(10))
        ctx.monitor.tick(asked=True)
        assert holding.wait(10)
        ctx.findings.record("r1", 1, [hang()], HOSTS).result()
        (alert,) = ctx.alerting.manager.alerts(run="r1")
        assert alert.ranks == (3,) and alert.hosts == ("node0",)
        assert set(ctx.alerting.outbox.records("alert")) == {alert.fingerprint}   # stored
        (delivery,) = ctx.alerting.outbox.deliveries()
        assert delivery.reason == "first_notification"
        held.set()
        ctx.alerting.tick = real_tick
        svc.drain()
        assert len(rx.delivered()) == 1


def test_a_failed_fold_keeps_the_findings_and_alerting_goes_on(tmp_path, db_uri, monkeypatch):
    # A fold that raises (a bug in alerting) must not lose the findings: they are stored with
    # what the fold decided before it raised, and the run's next findings alert as usual.
    with Receiver() as rx, service(tmp_path, db_uri, rx.url) as svc:
        ctx = svc.app.state.ctx
        manager = ctx.alerting.manager
        ctx.store.control.submit_run_config("r1", {}).result()
        notifier = manager._notifier
        real = type(notifier).process
        calls = []

        def broken_once(self, *args, **kwargs):
            calls.append(args[0])
            if len(calls) == 1:
                raise RuntimeError("alerting bug")
            return real(self, *args, **kwargs)
        monkeypatch.setattr(type(notifier), "process", broken_once)
        (first,) = ctx.findings.record("r1", 1, [hang(rank=3)], HOSTS).result().findings
        assert [sf.id for sf in ctx.findings.query("r1")] == [first.id]   # the finding is kept
        assert calls and manager.alerts(run="r1") == []
        ctx.findings.record("r1", 1, [hang(rank=9)], HOSTS).result()
        assert [a.ranks for a in manager.alerts(run="r1")] == [(9,)]
        svc.drain()
        (got,) = rx.delivered()
        assert [a["annotations"]["ranks"] for a in json.loads(got.body)["alerts"]] == ["9"]


def test_a_corruption_page_carries_its_rollback_target(tmp_path, db_uri):
    # The rollback target is decided from the stored findings and the new ones: the recorder
    # looks it up before the job, so the page goes out with it.
    with Receiver() as rx, service(tmp_path, db_uri, rx.url) as svc:
        ctx = svc.app.state.ctx
        ctx.store.control.submit_checkpoint("r1", 5, "mem://r1/5", None, None).result()
        ctx.findings.record("r1", 1, [nan(step=7)], HOSTS).result()
        (delivery,) = ctx.alerting.outbox.deliveries()   # in the findings' own job
        assert b"step 5 (mem://r1/5)" in delivery.body
        svc.drain()
        (got,) = rx.delivered()
        (alert,) = json.loads(got.body)["alerts"]
        assert alert["annotations"]["rollback_target"] == "step 5 (mem://r1/5)"


def test_a_run_adopted_in_the_group_commit_that_stores_its_first_alert_still_pages(tmp_path, db_uri):
    # A replica (re)takes a run while a findings job of that run waits for the writer: the two
    # jobs share one group commit, so the adoption must read the alerts through the group's
    # transaction. Read through another connection, the uncommitted alert was dropped from the
    # owner's memory and its page was never sent (what made the test above fail in CI).
    with Receiver() as rx, service(tmp_path, db_uri, rx.url) as svc:
        ctx = svc.app.state.ctx
        ctx.store.control.submit_checkpoint("r1", 5, "mem://r1/5", None, None).result()
        svc.drain()   # the owner took the run (PostgreSQL) and loaded its (no) alerts
        running, gate, adopt_queued = threading.Event(), threading.Event(), threading.Event()
        held = ctx.store.write(lambda conn: (running.set(), gate.wait(10)))
        assert running.wait(10)   # the writer waits in a group of its own: the next jobs group
        stored = ctx.findings.record("r1", 1, [nan(step=7)], HOSTS)
        real_write = ctx.store.write
        ctx.store.write = lambda job, **kw: (real_write(job, **kw), adopt_queued.set())[0]
        adopting = threading.Thread(target=ctx.alerting.owned, args=("r1", True))
        adopting.start()
        assert adopt_queued.wait(10)
        del ctx.store.write
        gate.set()
        held.result(10), stored.result(10)
        adopting.join(10)
        svc.drain()
        (got,) = rx.delivered()
        (alert,) = json.loads(got.body)["alerts"]
        assert alert["annotations"]["rollback_target"] == "step 5 (mem://r1/5)"


def test_ticking_the_alerts_never_makes_the_runs_owner_wait_for_the_writer(tmp_path, db_uri):
    # The monitor thread ticks its runs' alerts with its own ticks, as a job it does not wait for:
    # a writer held up (a long group commit, a database that is down) holds up alerting, never
    # the detectors. With the writer held, a tick asked for and the monitor's barrier behind it
    # both go through; the alert's tick is done once the writer is free.
    with Receiver() as rx, service(tmp_path, db_uri, rx.url) as svc:
        ctx = svc.app.state.ctx
        record(svc, "r1", [hang()])
        (sent,) = rx.delivered()
        running, gate = threading.Event(), threading.Event()
        held = ctx.store.write(lambda conn: (running.set(), gate.wait(30)))
        assert running.wait(10)
        try:
            ctx.monitor.tick(asked=True)
            assert ctx.monitor.drain(5.0), "the monitor waited for the writer"
            assert not held.done()
        finally:
            gate.set()
        held.result(10)
        svc.drain()
        (alert,) = ctx.alerting.manager.alerts(run="r1")
        assert alert.status == "firing" and len(rx.delivered()) == 1
