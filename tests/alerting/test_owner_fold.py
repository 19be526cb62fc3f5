"""The run's owner folds its findings into alerts before their job, and writes both in one job:
what happens when that job fails, and when the owner's idea of what is stored is stale.

Both cases leave memory ahead of the store for a moment; the next change reads the store back
(``AlertManager._resync``), so what the service shows and pages is what is stored, once."""
from __future__ import annotations

import json
import threading

import pytest

from healthsvc_detectors.finding import Finding
from healthsvc.store.findings import AlreadyStored
from healthsvc.store import findings as store_findings
from tests.alerting.receiver import Receiver, free_port
from tests.harness import InProcessService

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]

JSON = {"content-type": "application/json"}


def push(svc, step: int, loss: list[float]) -> None:
    body = {"columns": {"step": [step] * len(loss), "rank": list(range(len(loss))), "loss": loss}}
    assert svc.http.post("/v1/runs/r/metrics", content=json.dumps(body), headers=JSON).status_code == 202


def test_a_findings_job_that_fails_is_recorded_again_and_pages_once(tmp_path, db_uri, monkeypatch):
    with Receiver() as rx, InProcessService(tmp_path, db=db_uri, alert_webhooks=[
            {"id": "oncall", "url": rx.url, "format": "json"}]) as svc:
        ctx = svc.app.state.ctx
        for step in range(5):
            push(svc, step, [1.0, 1.0])
        svc.drain()
        failures = []
        real_apply = store_findings.apply_ops

        def failing_once(conn, ops):
            if not failures:
                failures.append(ops)
                raise OSError("disk I/O error")   # the findings job fails whole
            return real_apply(conn, ops)
        monkeypatch.setattr(store_findings, "apply_ops", failing_once)   # in the findings job
        push(svc, 5, [float("nan"), 1.0])
        svc.drain()
        assert failures and ctx.findings.query("r") == []      # nothing of that job is stored
        assert rx.delivered() == []
        # The owner's memory folded the NaN: the next change reads the store back first.
        svc.advance(1.0)   # the owner's tick records the findings again
        (stored,) = ctx.findings.query("r")
        assert stored.finding.kind == "non_finite" and stored.finding.step == 5
        (alert,) = ctx.alerting.manager.alerts(run="r")
        assert alert.kind == "non_finite" and set(ctx.alerting.outbox.records("alert")) == {alert.fingerprint}
        (page,) = rx.delivered()
        assert json.loads(page.body)["alerts"][0]["labels"]["alertname"] == "non_finite"


def test_a_finding_stored_behind_the_recorders_back_fails_its_job_whole(tmp_path, db_uri):
    # The recorder loaded the run's stored identities, then a tool stored a finding straight into
    # the store. Recorded through the service, it was folded as new: the job refuses to store
    # the fold's writes for a finding already there, and nothing of it is stored or paged.
    with Receiver() as rx, InProcessService(tmp_path, db=db_uri, alert_webhooks=[
            {"id": "oncall", "url": rx.url, "format": "json"}]) as svc:
        ctx = svc.app.state.ctx
        ctx.store.control.submit_run_config("r", {}).result()
        first = Finding("hang", step=50, ranks=(3,), severity="critical")
        ctx.findings.record("r", 1, [first], {3: "node0"}).result()   # loads the identities
        svc.drain()
        assert len(rx.delivered()) == 1
        behind = Finding("hang", step=90, ranks=(4,), severity="critical")
        ctx.store.findings.submit("r", 1, [behind], {4: "node0"}).result()
        with pytest.raises(AlreadyStored):
            ctx.findings.record("r", 1, [behind], {4: "node0"}).result()
        assert [a.ranks for a in ctx.alerting.manager.alerts(run="r")] == [(3,), (4,)]   # memory ahead
        # Recorded again (as its owner would): the identities are read again, the finding is
        # stored already, so nothing is folded; the next change reads the alerts back.
        assert ctx.findings.record("r", 1, [behind], {4: "node0"}).result().findings == []
        ctx.alerting.manager.tick(svc.clock())
        assert [a.ranks for a in ctx.alerting.manager.alerts(run="r")] == [(3,)]
        svc.drain()
        assert len(rx.delivered()) == 1
        assert sorted(sf.finding.step for sf in ctx.findings.query("r")) == [50, 90]


def test_deleting_a_settings_subscription_is_refused_and_cancels_nothing(tmp_path, db_uri):
    # The subscription's deletion is refused in memory; the job that would have cancelled its
    # pending deliveries must not run that cancel either.
    down = f"http://127.0.0.1:{free_port()}/hook"   # nothing listens: the page stays pending
    with InProcessService(tmp_path, db=db_uri, alert_webhooks=[{"id": "oncall", "url": down, "format": "json"}]) as svc:
        ctx = svc.app.state.ctx
        ctx.store.control.submit_run_config("r", {}).result()
        ctx.findings.record("r", 1, [Finding("hang", step=50, ranks=(3,), severity="critical")], {3: "n"}).result()
        svc.drain()
        (page,) = ctx.alerting.outbox.deliveries()
        assert page.state == "pending"
        r = svc.http.delete("/v1/webhooks/oncall")
        assert r.status_code == 409, r.text
        assert ctx.alerting.outbox.get(page.webhook_id).state == "pending"


def test_every_change_is_submitted_to_the_writer_while_the_managers_lock_is_held(tmp_path, db_uri):
    # What keeps the store in the order memory saw the changes: each change's job (a fold's
    # findings job, a tick's, an operator's) reaches the writer's queue while its thread still
    # holds the manager's lock, so no other change can be made between the two. Checked at
    # every write the store is handed, for each kind of change.
    with Receiver() as rx, InProcessService(tmp_path, db=db_uri, alert_webhooks=[
            {"id": "oncall", "url": rx.url, "format": "json"}]) as svc:
        ctx = svc.app.state.ctx
        manager = ctx.alerting.manager
        ctx.store.control.submit_run_config("r", {}).result()
        svc.drain()
        seen: list[tuple[str, bool]] = []
        real_write = ctx.store.write
        here = threading.current_thread()

        def write(job, *args, **kwargs):
            if threading.current_thread() is here and "barrier" not in getattr(job, "__qualname__", ""):
                seen.append((getattr(job, "__qualname__", ""), manager._lock._is_owned()))
            return real_write(job, *args, **kwargs)
        ctx.store.write = write
        try:
            ctx.findings.record("r", 1, [Finding("hang", step=50, ranks=(3,), severity="critical")], {3: "n"}).result()
            (alert,) = manager.alerts(run="r")
            manager.acknowledge(alert.fingerprint, "op", svc.clock())
            manager.tick_later(svc.clock()).result(10)
            manager.resolve(alert.fingerprint, "op", svc.clock())
        finally:
            del ctx.store.write
        # Every change above is made on this thread (the delivery worker's passes, on its own, are
        # jobs of no alert state); a tick with nothing to do writes nothing.
        assert [held for _, held in seen] == [True, True, True], seen
