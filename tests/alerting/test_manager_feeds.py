"""Receivers that are fed rather than paged (alertmanager_api, pass-through) and PagerDuty's
event lifecycle, over an in-memory outbox with the caller's clock."""
from __future__ import annotations

import json
from datetime import datetime

from healthsvc_detectors.finding import Finding
from healthsvc.alerting.manager import AlertManager
from healthsvc.alerting.model import LifecyclePolicy
from healthsvc.store.outbox import Outbox
from healthsvc.alerting.policy import Matcher
from healthsvc.alerting.subscription import Subscription

PD_KEY = "p" * 32


def manager(*subs: Subscription) -> AlertManager:
    return AlertManager(Outbox(":memory:"), subscriptions=subs, external_url="http://svc:8080",
                        lifecycle=LifecyclePolicy(resolve_timeout_s=60.0))


def bodies(m: AlertManager, ids: list[str]) -> list:
    return [json.loads(m.outbox.get(i).body) for i in ids]


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def nan(step=41):
    return Finding("non_finite", step=step, ranks=(2,), severity="critical", metric="loss")


def spike(rank=3):
    return Finding("loss_spike", step=40, ranks=(rank,), severity="warning", metric="loss")


def test_alertmanager_api_posts_postable_alerts_and_resends_firing_ones():
    m = manager(Subscription("am", "http://am:9093", format="alertmanager_api", resend_interval_s=60.0))
    ids = m.process("r1", [(nan(), ())], now=1000.0)
    (posted,) = bodies(m, ids)
    (a,) = posted
    assert set(a) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
    assert m.outbox.get(ids[0]).url == "http://am:9093/api/v2/alerts"
    assert ts(a["startsAt"]) == 1000.0 and ts(a["endsAt"]) == 1000.0 + 4 * 60.0
    assert a["generatorURL"].startswith("http://svc:8080/runs/r1?kind=non_finite&step=")  # the run page

    assert m.tick(1059.0) == []                               # not yet
    (again,) = bodies(m, m.tick(1060.0))                      # re-sent, endsAt pushed ahead
    assert ts(again[0]["endsAt"]) == 1060.0 + 240.0 and again[0]["startsAt"] == a["startsAt"]
    assert m.outbox.get(m.tick(1120.0)[0]).reason == "resend_interval_elapsed"

    fp = m.alerts()[0].fingerprint
    (last,) = bodies(m, _new(m, lambda: m.resolve(fp, "me", now=1130.0)))
    assert ts(last[0]["endsAt"]) == 1130.0                    # resolved: endsAt = now
    assert m.tick(1300.0) == []                               # nothing firing: no more re-sends


def test_pass_through_ignores_grouping_inhibition_and_silences():
    grouped = Subscription("grouped", "http://am:9093", format="alertmanager_api")
    through = Subscription("through", "http://am2:9093", format="alertmanager_api", pass_through=True,
                           resend_interval_s=30.0)
    m = manager(grouped, through)
    m.add_silence([Matcher("alertname", "loss_spike")], 0.0, 1e12, now=0.0)
    # A warning waits for its group wait when grouped, and is silenced; pass-through sends it now.
    ids = m.process("r1", [(spike(), ())], now=100.0)
    assert [m.outbox.get(i).subscription_id for i in ids] == ["through"]
    # The NaN inhibits the spike for grouped receivers; pass-through sends just the new alert.
    ids = m.process("r1", [(nan(), ())], now=101.0)
    by_sub = {m.outbox.get(i).subscription_id: json.loads(m.outbox.get(i).body) for i in ids}
    assert [x["labels"]["alertname"] for x in by_sub["through"]] == ["non_finite"]
    assert [x["labels"]["alertname"] for x in by_sub["grouped"]] == ["non_finite"]
    # Re-sends to pass-through carry every firing alert, the silenced one too.
    (resent,) = [json.loads(m.outbox.get(i).body) for i in m.tick(130.0) if m.outbox.get(i).subscription_id == "through"]
    assert sorted(x["labels"]["alertname"] for x in resent) == ["loss_spike", "non_finite"]
    # The spike's condition expires (at 160): pass-through is told at once, endsAt when it resolved.
    ids = m.tick(175.0)
    sent = [json.loads(m.outbox.get(i).body) for i in ids
            if m.outbox.get(i).subscription_id == "through" and m.outbox.get(i).reason == "new_resolved_alerts"]
    assert [(x["labels"]["alertname"], ts(x["endsAt"])) for body in sent for x in body] == [("loss_spike", 160.0)]


def test_pagerduty_triggers_acknowledges_and_resolves_one_dedup_key():
    m = manager(Subscription("pd", "http://127.0.0.1:9/pd", format="pagerduty", routing_key=PD_KEY))
    slow = Finding("straggler", step=40, ranks=(5,), severity="warning")
    m.process("r1", [(nan(), ("node0",)), (slow, (None,))], now=100.0)   # critical: at once, both alerts
    firing = [json.loads(d.body) for d in m.outbox.due(now=1e12)]
    assert sorted((e["event_action"], e["payload"]["severity"]) for e in firing) == [
        ("trigger", "critical"), ("trigger", "warning")]
    nan_fp = next(a.fingerprint for a in m.alerts() if a.kind == "non_finite")
    (trigger,) = [e for e in firing if e["dedup_key"] == nan_fp]
    assert trigger["payload"]["source"] == "node0" and trigger["payload"]["component"] == "rank 2"
    assert trigger["routing_key"] == PD_KEY

    (ack,) = bodies(m, _new(m, lambda: m.acknowledge(nan_fp, "alice", now=110.0)))
    assert ack == {"routing_key": PD_KEY, "event_action": "acknowledge", "dedup_key": nan_fp}
    m.resolve(nan_fp, "alice", now=120.0)         # notified at the group's next flush
    resolved = [b for b in bodies(m, _new(m, lambda: m.tick(120.0 + 300.0))) if b["dedup_key"] == nan_fp]
    assert resolved == [{"routing_key": PD_KEY, "event_action": "resolve", "dedup_key": nan_fp}]


def _new(m: AlertManager, action) -> list[str]:
    before = {d.webhook_id for d in m.outbox.due(now=1e12)}
    action()
    return [d.webhook_id for d in m.outbox.due(now=1e12) if d.webhook_id not in before]
