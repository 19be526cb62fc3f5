"""The alert manager end to end over an in-memory outbox: findings in, enqueued bodies out."""
from __future__ import annotations

import json

from healthsvc_detectors.finding import Finding
from healthsvc.alerting.manager import AlertManager
from healthsvc.alerting.model import LifecyclePolicy
from healthsvc.store.outbox import Outbox
from healthsvc.alerting.policy import Matcher
from healthsvc.alerting.subscription import Subscription

HOSTS = {r: f"node{r // 8}" for r in range(512)}


def blamed(findings):
    """Findings with their blamed ranks' hosts, as the store hands them to alerting."""
    return [(f, tuple(HOSTS.get(r) for r in f.ranks)) for f in findings]


def manager(outbox=None, subs=None, **kw):
    subs = subs if subs is not None else [Subscription("am", "http://127.0.0.1:9/am", format="alertmanager")]
    return AlertManager(outbox or Outbox(":memory:"), subscriptions=subs,
                        lifecycle=kw.pop("lifecycle", LifecyclePolicy(resolve_timeout_s=60.0)),
                        external_url="http://svc", **kw)


def bodies(m, ids):
    return [json.loads(m.outbox.get(i).body) for i in ids]


def nan(step=41, ranks=tuple(range(512)), metric="loss"):
    return Finding("non_finite", step=step, ranks=ranks, severity="critical", metric=metric)


def spike(kind="loss_spike", step=40, rank=3, severity="warning"):
    return Finding(kind, step=step, ranks=(rank,), severity=severity, metric="loss")


def test_nan_on_512_ranks_is_one_notification_enqueued_at_once():
    m = manager()
    ids = m.process("r1", blamed([nan()]), now=100.0)
    assert len(ids) == 1
    (body,) = bodies(m, ids)
    assert len(body["alerts"]) == 1 and body["alerts"][0]["labels"]["rank"] == "0-511"
    assert body["alerts"][0]["annotations"]["rank_count"] == "512"
    # Many-rank findings of the same NaN arriving in later blocks fold into the same alert: no page.
    assert m.process("r1", blamed([nan(step=42, ranks=(5, 6)) for _ in range(3)] + [nan(step=42)]), 101.0) == []
    assert m.alerts()[0].ranks == tuple(range(512))
    assert m.tick(200.0) == []


def test_warning_waits_for_group_wait_and_groups_what_arrives_meanwhile():
    m = manager()
    assert m.process("r1", blamed([spike(rank=3)]), now=100.0) == []
    assert m.process("r1", blamed([spike(rank=4)]), now=110.0) == []
    assert m.tick(129.0) == []
    ids = m.tick(130.0)
    assert len(ids) == 1 and len(bodies(m, ids)[0]["alerts"]) == 2


def test_new_alert_in_group_waits_for_group_interval():
    m = manager()
    m.process("r1", blamed([nan()]), now=100.0)
    assert m.process("r1", blamed([Finding("hang", step=50, ranks=(9,), severity="critical")]), now=101.0) == []
    assert m.tick(109.9) == []
    ids = m.tick(110.0)   # critical group_interval is 10 s
    (body,) = bodies(m, ids)
    assert m.outbox.get(ids[0]).reason == "new_alerts_in_group"
    assert {a["labels"]["alertname"] for a in body["alerts"]} == {"non_finite", "hang"}


def test_nan_inhibits_the_spike_it_explains():
    m = manager()
    m.process("r1", blamed([spike(), nan()]), now=100.0)
    (body,) = bodies(m, m.outbox.due(1e12) and [d.webhook_id for d in m.outbox.due(1e12)])
    assert [a["labels"]["alertname"] for a in body["alerts"]] == ["non_finite"]
    view = m.muting(m.alerts(run="r1"), now=100.0)
    assert {m.alert(fp).kind: v["inhibited"] for fp, v in view.items()} == {"non_finite": False, "loss_spike": True}


def test_stall_inhibits_hangs_of_the_same_run_only():
    m = manager()
    stall = Finding("stall", step=500, severity="critical")
    hang = Finding("hang", step=500, ranks=(2,), severity="critical")
    m.process("r1", blamed([stall, hang]), 100.0)
    m.process("r2", blamed([hang]), 100.0)
    sent = {d.group_key: json.loads(d.body) for d in m.outbox.due(1e12)}
    assert [a["labels"]["alertname"] for a in sent['{}:{run="r1"}']["alerts"]] == ["stall"]
    assert [a["labels"]["alertname"] for a in sent['{}:{run="r2"}']["alerts"]] == ["hang"]


def test_subscription_filters():
    subs = [Subscription("crit", "http://127.0.0.1:9/a", min_severity="critical"),
            Subscription("r2-only", "http://127.0.0.1:9/b", runs=("r2",)),
            Subscription("spikes", "http://127.0.0.1:9/c", kinds=("loss_spike",))]
    m = manager(subs=subs)
    m.process("r1", blamed([nan()]), 100.0)
    m.process("r1", blamed([spike(rank=1)]), 100.0)   # inhibited by the NaN for everyone
    m.process("r2", blamed([spike(rank=1)]), 100.0)
    m.tick(130.0)   # warning group_wait
    got = {(d.subscription_id, d.group_key) for d in m.outbox.deliveries()}
    assert got == {("crit", '{}:{run="r1"}'), ("r2-only", '{}:{run="r2"}'), ("spikes", '{}:{run="r2"}')}


def test_silence_mutes_then_its_expiry_notifies():
    m = manager()
    s = m.add_silence([Matcher("run", "r1")], starts_at=0.0, ends_at=300.0, now=50.0, created_by="ann")
    assert m.process("r1", blamed([nan()]), 100.0) == []
    assert m.tick(200.0) == []
    assert m.muting(m.alerts(), 200.0)[m.alerts()[0].fingerprint]["silenced_by"] == [s.id]
    ids = m.tick(310.0)
    assert [m.outbox.get(i).reason for i in ids] == ["first_notification"]


def test_silencing_everything_shown_sends_nothing_and_unmuting_notifies_again():
    m = manager()
    m.process("r1", blamed([nan()]), 100.0)
    s = m.add_silence([Matcher("alertname", "non_finite")], 100.0, 10_000.0, now=100.0)
    assert m.tick(120.0) == []          # all_alerts_muted: nothing sent, log forgets
    m.expire_silence(s.id, now=130.0)
    ids = m.tick(140.0)
    assert [m.outbox.get(i).reason for i in ids] == ["first_notification"]


def test_resolution_is_notified_and_latched_alerts_need_a_hand():
    m = manager()
    m.process("r1", blamed([spike(severity="critical"), nan()]), 100.0)
    m.process("r1", blamed([Finding("non_finite", step=50, ranks=tuple(range(512)), metric="loss", status="resolved")]), 105.0)
    # the spike resolves 60 s after it was last seen; the latched NaN stays
    ids = m.tick(170.0)
    assert ids == []   # the spike was never shown (inhibited), so its resolution is no news
    fp = m.alerts(kind="non_finite")[0].fingerprint
    assert m.alert(fp).status == "firing"
    m.resolve(fp, by="ann", now=180.0)   # the group is past its interval: flushed at once
    newest = m.outbox.deliveries()[0]
    body = json.loads(newest.body)
    assert newest.reason == "all_alerts_resolved" and m.tick(190.0) == []
    assert body["status"] == "resolved" and body["alerts"][0]["annotations"]["resolved_by"] == "ann"   # who resolved it


def test_rollback_resolves_corruption_that_began_after_the_checkpoint():
    m = manager()
    m.process("r1", blamed([nan(step=300)]), 100.0)
    m.process("r1", blamed([Finding("rank_outlier", step=90, ranks=(7,), severity="critical", metric="grad_norm",
                             onset_step=80)]), 100.0)
    done = m.rollback("r1", step=200, now=150.0)
    assert [a.kind for a in done] == ["non_finite"]
    assert {a.kind: a.status for a in m.alerts(run="r1")} == {"non_finite": "resolved", "rank_outlier": "firing"}


def test_repeat_interval_and_acknowledgement():
    m = manager()
    m.process("r1", blamed([nan()]), 100.0)
    assert [m.outbox.get(i).reason for i in m.tick(100.0 + 3600.0)] == ["repeat_interval_elapsed"]
    m.acknowledge(m.alerts()[0].fingerprint, by="ann", now=3800.0)
    assert m.tick(100.0 + 3 * 3600.0) == []


def test_rollback_target_annotation():
    m = manager(rollback_lookup=lambda run: {"step": 1200, "uri": "s3://ck/1200"})
    (i,) = m.process("r1", blamed([nan()]), 100.0)
    assert json.loads(m.outbox.get(i).body)["alerts"][0]["annotations"]["rollback_target"] == "step 1200 (s3://ck/1200)"


def test_restart_reads_state_back_and_does_not_page_twice(tmp_path):
    db = tmp_path / "svc.db"
    m = manager(Outbox(db))
    m.process("r1", blamed([nan(), spike("straggler", rank=4)]), 100.0)
    s = m.put_subscription(Subscription("api-1", "http://127.0.0.1:9/x", format="slack"), 100.0)
    m.add_silence([Matcher("run", "other")], 0.0, 1e12, now=100.0)
    n_before = len(m.outbox.deliveries())

    again = manager(Outbox(db))
    assert {a.fingerprint: a for a in again.alerts()} == {a.fingerprint: a for a in m.alerts()}
    assert [x.id for x in again.subscriptions()] == ["am", "api-1"] and again.subscription("api-1") == s
    assert len(again.silences()) == 1
    assert again.tick(105.0) == []   # within group_interval: nothing new
    ids = again.tick(111.0)          # the API subscription has not been told yet
    assert [again.outbox.get(i).subscription_id for i in ids] == ["api-1"]
    assert len(again.outbox.deliveries()) == n_before + 1


def test_resolution_owed_before_a_restart_is_sent_after_it(tmp_path):
    db = tmp_path / "svc.db"
    m = manager(Outbox(db))
    m.process("r1", blamed([nan()]), 100.0)
    m.resolve(m.alerts()[0].fingerprint, by="ann", now=101.0)   # within group_interval: not sent yet
    again = manager(Outbox(db))
    ids = again.tick(120.0)
    assert [again.outbox.get(i).reason for i in ids] == ["all_alerts_resolved"]


def test_deleting_a_subscription_cancels_its_pending_deliveries():
    m = manager(subs=[])
    m.put_subscription(Subscription("x", "http://127.0.0.1:9/x"), 0.0)
    m.process("r1", blamed([nan()]), 100.0)
    assert m.delete_subscription("x", 101.0) == 1
    assert m.outbox.state_counts("x")["cancelled"] == 1


def test_rollback_resolves_by_the_runs_estimated_onset_when_there_is_one():
    """One onset: with the estimate GET /rollback dates the incident by, a checkpoint after it
    still holds the corruption, so nothing resolves; one before it resolves every latched alert."""
    m = manager()
    m.process("r1", blamed([nan(step=300)]), 100.0)
    m.process("r1", blamed([Finding("rank_outlier", step=290, ranks=(7,), severity="critical", metric="grad_norm",
                             onset_step=280)]), 100.0)
    assert m.rollback("r1", step=200, now=150.0, onset=150) == []
    assert {a.status for a in m.alerts(run="r1")} == {"firing"}
    done = m.rollback("r1", step=100, now=160.0, onset=150)
    assert sorted(a.kind for a in done) == ["non_finite", "rank_outlier"]


def test_an_alert_keeps_its_identity_as_ranks_join_the_fault():
    # A hang on rank 3 pages once; when rank 4 hangs with it the finding blames (3, 4): that is
    # the same fault spreading, so it joins the rank-3 alert instead of paging again as "3-4".
    m = manager()
    hang = lambda ranks, step: Finding("hang", step=step, ranks=ranks, severity="critical")  # noqa: E731
    assert len(m.process("r1", blamed([hang((3,), 50)]), now=100.0)) == 1
    assert m.process("r1", blamed([hang((3, 4), 51)]), now=101.0) == []
    (a,) = m.alerts()
    assert a.label_dict["rank"] == "3" and a.ranks == (3, 4) and a.hosts == ("node0",)
    # A fault on ranks it does not share is another alert (its own rank set), paged with the
    # run's group at its next interval (10 s for critical).
    m.process("r1", blamed([hang((9, 10), 52)]), now=102.0)
    assert sorted(x.label_dict["rank"] for x in m.alerts()) == ["3", "9-10"]
    (body,) = bodies(m, m.tick(112.0))
    assert sorted(x["labels"]["rank"] for x in body["alerts"]) == ["3", "9-10"]
    # ... and it keeps that identity as its set grows or shrinks while it fires.
    assert m.process("r1", blamed([hang((9, 10, 11), 53), hang((10,), 54)]), now=103.0) == []
    assert sorted((x.label_dict["rank"], x.ranks) for x in m.alerts()) == [("3", (3, 4)), ("9-10", (9, 10, 11))]


def cleared(step=50, rank=3):
    return Finding("loss_spike", step=step, ranks=(rank,), severity="info", metric="loss", status="resolved")


def test_a_late_tick_does_not_hide_a_warning_that_fired_past_its_group_wait():
    # The group's first flush fell due at 130 (group_wait 30 s) and no tick came by then (the
    # run's owner was busy replaying a run it took over); the finding that resolves the alert is
    # folded at 150. The receiver hears what a tick on time would have told it: the alert fired.
    m = manager()
    assert m.process("r1", blamed([spike(rank=3)]), now=100.0) == []
    ids = m.process("r1", blamed([cleared()]), now=150.0)
    assert [b["status"] for b in bodies(m, ids)][:1] == ["firing"]
    assert m.alerts(run="r1")[0].status == "resolved"


def test_an_alert_resolved_within_its_group_wait_is_never_paged():
    # Alertmanager's rule, kept: a blip that fires and clears before its group's first flush is
    # not worth a page (the late-tick rule above applies only past the wait).
    m = manager()
    assert m.process("r1", blamed([spike(rank=3)]), now=100.0) == []
    assert m.process("r1", blamed([cleared()]), now=110.0) == []
    assert m.tick(130.0) == [] and m.tick(1000.0) == []
