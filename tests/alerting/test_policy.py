"""Pure, table-driven tests of the notify decision, group timing, inhibition and silences."""
from __future__ import annotations

import pytest

from healthsvc_detectors.finding import Finding
from healthsvc.alerting import model
from healthsvc.alerting.policy import (
    DEFAULT_TIMINGS, Matcher, NotificationLogEntry, NotifyReason, Silence, Timing, flush_due,
    group_key, group_timing, inhibited, needs_update, silenced,
)

R = NotifyReason


def entry(firing=(), resolved=(), sent_at=1000.0):
    return NotificationLogEntry(frozenset(firing), frozenset(resolved), sent_at)


# (name, log entry, firing now, resolved now, now, extra kwargs, expected reason)
NEEDS_UPDATE_CASES = [
    ("nothing sent, something fires", None, {"a"}, set(), 1000.0, {}, R.FIRST_NOTIFICATION),
    ("nothing sent, only resolved", None, set(), {"a"}, 1000.0, {}, R.DO_NOT_NOTIFY),
    ("nothing sent, nothing at all", None, set(), set(), 1000.0, {}, R.DO_NOT_NOTIFY),
    ("same firing set, within repeat", entry({"a"}), {"a"}, set(), 1010.0, {}, R.DO_NOT_NOTIFY),
    ("new alert joins the group", entry({"a"}), {"a", "b"}, set(), 1010.0, {}, R.NEW_ALERTS_IN_GROUP),
    ("fires again after all resolved", entry((), {"a"}), {"a"}, set(), 1010.0, {}, R.FIRST_NOTIFICATION),
    ("all shown alerts resolved", entry({"a", "b"}), set(), {"a", "b"}, 1010.0, {}, R.ALL_ALERTS_RESOLVED),
    ("fired and resolved unseen", entry((), {"x"}), set(), {"a"}, 1010.0, {}, R.DO_NOT_NOTIFY),
    ("one of two resolved", entry({"a", "b"}), {"a"}, {"b"}, 1010.0, {}, R.NEW_RESOLVED_ALERTS),
    ("one of two resolved, resolved not sent", entry({"a", "b"}), {"a"}, {"b"}, 1010.0,
     {"send_resolved": False}, R.DO_NOT_NOTIFY),
    ("resolved already sent", entry({"a"}, {"b"}), {"a"}, {"b"}, 1010.0, {}, R.DO_NOT_NOTIFY),
    ("repeat interval elapsed", entry({"a"}), {"a"}, set(), 1000.0 + 3600.0, {}, R.REPEAT_INTERVAL_ELAPSED),
    ("repeat interval not yet", entry({"a"}), {"a"}, set(), 1000.0 + 3599.0, {}, R.DO_NOT_NOTIFY),
    ("repeat skipped when all acknowledged", entry({"a"}), {"a"}, set(), 1000.0 + 7200.0,
     {"all_acknowledged": True}, R.DO_NOT_NOTIFY),
    ("acknowledged, but a new alert", entry({"a"}), {"a", "b"}, set(), 1010.0,
     {"all_acknowledged": True}, R.NEW_ALERTS_IN_GROUP),
    ("shown alert muted, still firing", entry({"a"}), set(), set(), 1010.0,
     {"muted_firing": {"a"}}, R.ALL_ALERTS_MUTED),
    ("one muted one resolved", entry({"a", "b"}), set(), {"b"}, 1010.0,
     {"muted_firing": {"a"}}, R.ALL_ALERTS_RESOLVED),
    ("shrinking firing set is no news", entry({"a", "b"}), {"a"}, set(), 1010.0, {}, R.DO_NOT_NOTIFY),
]


@pytest.mark.parametrize("name,log,firing,resolved,now,kw,expected", NEEDS_UPDATE_CASES,
                         ids=[c[0] for c in NEEDS_UPDATE_CASES])
def test_needs_update(name, log, firing, resolved, now, kw, expected):
    assert needs_update(log, firing, resolved, 3600.0, now, **kw) is expected


def test_reasons_that_send_and_that_update_the_log():
    assert {r for r in R if r.should_notify} == {
        R.FIRST_NOTIFICATION, R.NEW_ALERTS_IN_GROUP, R.ALL_ALERTS_RESOLVED,
        R.NEW_RESOLVED_ALERTS, R.REPEAT_INTERVAL_ELAPSED, R.RESEND_INTERVAL_ELAPSED, R.ACKNOWLEDGED}
    assert {r for r in R if not r.updates_log} == {R.DO_NOT_NOTIFY}


T = Timing(group_wait_s=30.0, group_interval_s=300.0, repeat_interval_s=3600.0)
FLUSH_CASES = [
    ("first flush waits group_wait", 100.0, None, 129.9, False),
    ("first flush at group_wait", 100.0, None, 130.0, True),
    ("next flush waits group_interval", 100.0, 130.0, 429.0, False),
    ("next flush after group_interval", 100.0, 130.0, 430.0, True),
]


@pytest.mark.parametrize("name,first,last,now,due", FLUSH_CASES, ids=[c[0] for c in FLUSH_CASES])
def test_flush_due(name, first, last, now, due):
    assert flush_due(first, last, T, now) is due


def alert(kind, run="r1", ranks=(3,), severity="warning", status="firing", now=100.0):
    a = model.fire(None, Finding(kind, step=10, ranks=ranks, severity=severity, metric="loss"), run, (), now)
    return model.resolve_by_hand(a, now + 1) if status == "resolved" else a


def test_critical_goes_out_at_once_and_group_takes_worst_severity():
    assert DEFAULT_TIMINGS["critical"].group_wait_s == 0.0
    group = [alert("loss_spike"), alert("non_finite", severity="critical")]
    assert group_timing(group) == DEFAULT_TIMINGS["critical"]
    assert flush_due(100.0, None, group_timing(group), 100.0)
    assert group_timing([alert("straggler", severity="info")]) == DEFAULT_TIMINGS["info"]


def test_group_key_has_alertmanager_shape():
    assert group_key("r1") == '{}:{run="r1"}'
    assert group_key('we"ird') == '{}:{run="we\\"ird"}'


# (name, alerts, expected muted alertnames)
INHIBIT_CASES = [
    ("nan mutes spikes and divergence of its run",
     [alert("non_finite"), alert("loss_spike"), alert("grad_spike"), alert("divergence")],
     {"loss_spike", "grad_spike", "divergence"}),
    ("nan does not mute other runs", [alert("non_finite", run="r1"), alert("loss_spike", run="r2")], set()),
    ("resolved nan mutes nothing", [alert("non_finite", status="resolved"), alert("loss_spike")], set()),
    ("nan does not mute stragglers", [alert("non_finite"), alert("straggler")], set()),
    ("stall mutes hang and straggler", [alert("stall", ranks=()), alert("hang"), alert("straggler")],
     {"hang", "straggler"}),
    ("hang alone is not muted", [alert("hang"), alert("straggler")], set()),
    ("source is never muted by itself", [alert("non_finite"), alert("stall", ranks=())], set()),
]


@pytest.mark.parametrize("name,alerts,expected", INHIBIT_CASES, ids=[c[0] for c in INHIBIT_CASES])
def test_inhibition(name, alerts, expected):
    muted = inhibited(alerts)
    assert {a.kind for a in alerts if a.fingerprint in muted} == expected


# (name, matcher, labels, matches)
MATCHER_CASES = [
    ("equal", Matcher("run", "r1"), {"run": "r1"}, True),
    ("equal, other value", Matcher("run", "r1"), {"run": "r2"}, False),
    ("not equal", Matcher("run", "r1", "!="), {"run": "r2"}, True),
    ("regex is anchored", Matcher("alertname", "loss", "=~"), {"alertname": "loss_spike"}, False),
    ("regex full match", Matcher("alertname", "loss_.*|grad_.*", "=~"), {"alertname": "grad_spike"}, True),
    ("negative regex", Matcher("alertname", ".*_spike", "!~"), {"alertname": "hang"}, True),
    ("missing label is empty", Matcher("metric", "", "="), {"run": "r1"}, True),
]


@pytest.mark.parametrize("name,matcher,labels,hit", MATCHER_CASES, ids=[c[0] for c in MATCHER_CASES])
def test_matchers(name, matcher, labels, hit):
    assert matcher.matches(labels) is hit


def test_silence_mutes_only_while_active_and_only_matching_alerts():
    spike, nan = alert("loss_spike"), alert("non_finite", severity="critical")
    s = Silence("s1", (Matcher("alertname", "loss_spike"), Matcher("run", "r1")), starts_at=200.0, ends_at=300.0)
    assert silenced([spike, nan], [s], now=199.0) == set()
    assert silenced([spike, nan], [s], now=200.0) == {spike.fingerprint}
    assert silenced([spike, nan], [s], now=300.0) == set()   # expired at ends_at
    by_severity = Silence("s2", (Matcher("severity", "warning"),), 0.0, 1e12)
    assert silenced([spike, nan], [by_severity], now=5.0) == {spike.fingerprint}


def test_silence_validation_says_what_is_wrong():
    with pytest.raises(ValueError, match="at least one matcher"):
        Silence("s", (), 0.0, 1.0)
    with pytest.raises(ValueError, match="after starts_at"):
        Silence("s", (Matcher("run", "r"),), 5.0, 5.0)
    with pytest.raises(ValueError, match="op"):
        Matcher("run", "r", "==")
