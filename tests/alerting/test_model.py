"""Alert identity and lifecycle."""
from __future__ import annotations

import hashlib

import pytest

from healthsvc_detectors.finding import Finding
from healthsvc.alerting import model
from healthsvc.alerting.model import LifecyclePolicy, alert_labels, compact_ranks, fingerprint

P = LifecyclePolicy(resolve_timeout_s=60.0)


def f(kind="loss_spike", step=100, ranks=(3,), severity="warning", status="firing", metric="loss", onset=None):
    return Finding(kind, step=step, ranks=ranks, severity=severity, status=status, metric=metric, onset_step=onset)


def test_labels_single_rank_many_ranks_run_wide():
    assert alert_labels(f(ranks=(3,)), "r1") == {"alertname": "loss_spike", "run": "r1", "rank": "3", "metric": "loss"}
    assert alert_labels(f(ranks=(3, 4)), "r1")["rank"] == "3-4"   # a rank set is its own condition
    assert alert_labels(f(ranks=(3, 4)), "r1") != alert_labels(f(ranks=(5, 6)), "r1")
    assert alert_labels(f(kind="stall", ranks=(), metric=None), "r1") == {"alertname": "stall", "run": "r1", "rank": "*"}


def test_fingerprint_is_stable_order_free_and_distinguishes_labels():
    a = {"alertname": "hang", "run": "r1", "rank": "3"}
    assert fingerprint(a) == fingerprint(dict(reversed(list(a.items()))))
    assert fingerprint(a) != fingerprint({**a, "rank": "4"})
    assert len(fingerprint(a)) == 16
    # The documented recipe, recomputed here: fingerprints are stored and sent to receivers, so
    # they must not drift between versions.
    expected = hashlib.sha256(b"alertname=stall\nrank=*\nrun=r1").hexdigest()[:16]
    assert fingerprint({"run": "r1", "rank": "*", "alertname": "stall"}) == expected


@pytest.mark.parametrize("ranks,text", [((), ""), ((5,), "5"), ((0, 1, 2, 5, 7, 8), "0-2,5,7-8"),
                                        (tuple(range(512)), "0-511"), ((9, 1, 1, 2), "1-2,9")])
def test_compact_ranks(ranks, text):
    assert compact_ranks(ranks) == text


def test_many_rank_findings_fold_into_one_alert_with_the_union_of_ranks():
    a = model.fire(None, f(kind="non_finite", ranks=tuple(range(256)), severity="critical"), "r1", (), 10.0)
    b = model.fire(a, f(kind="non_finite", step=101, ranks=tuple(range(256, 512)), severity="critical"), "r1", (), 11.0)
    assert b.fingerprint == a.fingerprint and b.starts_at == 10.0 and b.last_seen_at == 11.0
    assert b.ranks == tuple(range(512)) and b.annotations()["ranks"] == "0-511"
    assert b.first_step == 100 and b.last_step == 101 and b.latched


def test_severity_escalates_without_changing_identity():
    a = model.fire(None, f(severity="warning"), "r1", (), 0.0)
    b = model.fire(a, f(severity="critical", step=105), "r1", (), 1.0)
    assert (b.fingerprint, b.severity, b.routing_labels()["severity"]) == (a.fingerprint, "critical", "critical")


def test_annotations_carry_the_human_part():
    a = model.fire(None, f(kind="non_finite", ranks=(7,), severity="critical", onset=98), "r1", ("node-b",), 0.0)
    a = model.Alert(**{**a.__dict__, "rollback_target": {"step": 90, "uri": "s3://ck/90"}})
    ann = a.annotations("http://svc:8080/", "https://wiki.example.com/runbook")
    assert ann["summary"] == "non finite in loss on rank 7 of run r1 since step 100"
    assert (ann["first_step"], ann["onset_step"], ann["hosts"]) == ("100", "98", "node-b")
    assert ann["rollback_target"] == "step 90 (s3://ck/90)"
    assert ann["run_url"] == "http://svc:8080/runs/r1"   # the dashboard page, not the JSON
    assert ann["runbook_url"] == "https://wiki.example.com/runbook#non_finite"
    assert ann["description"] == ("Non finite in loss on rank 7 of run r1 since step 100. A metric was NaN or "
                                  "infinite: the weights are likely corrupted from this step on. Resume from "
                                  "the checkpoint at step 90 (s3://ck/90).")


def test_no_refire_resolves_after_the_timeout_with_a_tick_independent_end_time():
    a = model.fire(None, f(), "r1", (), 100.0)
    assert model.expire(a, 159.9, P).status == "firing"
    done = model.expire(a, 500.0, P)
    assert (done.status, done.ends_at, done.resolved_by) == ("resolved", 160.0, "condition")


def test_refire_postpones_resolution():
    a = model.fire(model.fire(None, f(), "r1", (), 100.0), f(step=120), "r1", (), 150.0)
    assert model.expire(a, 200.0, P).status == "firing"
    assert model.expire(a, 210.0, P).ends_at == 210.0


@pytest.mark.parametrize("kind", ["hang", "loss_spike"])
def test_a_resolved_finding_resolves_the_alert_at_once_and_a_new_firing_reopens_it(kind):
    a = model.clear(model.fire(None, f(kind=kind), "r1", (), 100.0), 130.0)
    assert (a.status, a.ends_at, a.resolved_by) == ("resolved", 130.0, "condition")
    again = model.fire(a, f(kind=kind, step=130), "r1", (), 150.0)
    assert (again.status, again.starts_at, again.cleared_at) == ("firing", 150.0, None)


def test_an_alert_never_ends_before_it_began():
    """Findings are folded at the time their input arrived: one a tick raised (at the time of the
    tick) may be followed by one a push that arrived a moment earlier raised."""
    a = model.clear(model.fire(None, f(kind="stall"), "r1", (), 100.0), 99.5)
    assert (a.status, a.starts_at, a.ends_at, a.cleared_at) == ("resolved", 100.0, 100.0, 100.0)


def test_an_alert_cleared_by_an_earlier_version_still_resolves_after_the_timeout():
    a = model.fire(None, f(kind="hang"), "r1", (), 100.0)
    a = model.Alert(**{**a.__dict__, "cleared_at": 130.0})   # stored firing and cleared: that version waited
    assert model.expire(a, 189.0, P).status == "firing"
    assert model.expire(a, 190.0, P).ends_at == 190.0


def test_hang_never_resolves_by_silence_alone():
    a = model.fire(None, f(kind="hang"), "r1", (), 100.0)
    assert model.expire(a, 1e9, P).status == "firing"


@pytest.mark.parametrize("kind", ["non_finite", "rank_outlier", "divergence"])
def test_latched_kinds_stay_until_resolved_by_hand(kind):
    a = model.clear(model.fire(None, f(kind=kind, severity="critical"), "r1", (), 100.0), 110.0)
    assert a.latched and model.expire(a, 1e9, P).status == "firing"
    done = model.resolve_by_hand(a, 200.0, "rollback")
    assert (done.status, done.ends_at, done.resolved_by) == ("resolved", 200.0, "rollback")


def test_firing_again_after_resolution_reopens_with_a_new_start():
    a = model.resolve_by_hand(model.fire(None, f(), "r1", (), 100.0), 120.0)
    b = model.fire(a, f(step=300), "r1", (), 400.0)
    assert (b.status, b.starts_at, b.first_step, b.ends_at) == ("firing", 400.0, 300, None)


def test_dict_round_trip_keeps_the_alert():
    a = model.acknowledge(model.fire(None, f(ranks=(1, 2)), "r1", ("h1", None), 100.0), 101.0, "ann")
    assert model.Alert.from_dict(a.to_dict("http://x")) == a
