"""Delivery against a real HTTP receiver on 127.0.0.1 that fails on cue."""
from __future__ import annotations

import json
import random
import time
from email.utils import formatdate

import jsonschema
import pytest

from healthsvc_detectors.finding import Finding
from healthsvc.alerting.delivery import Backoff, DeliveryWorker, parse_retry_after
from healthsvc.alerting.manager import AlertManager
from healthsvc.store.outbox import Outbox
from healthsvc.alerting.signing import generate_secret, verify
from healthsvc.alerting.subscription import Subscription
from tests.alerting.amschema import ALERTMANAGER_V4
from tests.alerting.receiver import Receiver, free_port
from tests.barriers import wait_until
from tests.harness import FakeClock

pytestmark = pytest.mark.timeout(60)

FAST = dict(timeout_s=0.3, backoff=Backoff(base_s=0.01, cap_s=0.05), poll_interval_s=0.05, rng=random.Random(7))
SECRET = generate_secret()


def assert_signed(r):
    verify(SECRET, r.headers, r.body, now=time.time())


def test_backoff_is_full_jitter_under_an_exponential_cap():
    b, rng = Backoff(base_s=1.0, cap_s=10.0), random.Random(0)
    for attempt, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (30, 10.0)]:
        delays = [b.delay_s(attempt, rng) for _ in range(2000)]
        assert 0.0 <= min(delays) and max(delays) <= cap
        assert max(delays) > 0.9 * cap and min(delays) < 0.1 * cap   # spread over the whole range


@pytest.mark.parametrize("value,now,expected", [
    ("3", 0.0, 3.0), (" 120 ", 0.0, 120.0), (None, 0.0, None), ("", 0.0, None), ("soon", 0.0, None),
    (formatdate(1_700_000_030, usegmt=True), 1_700_000_000.0, 30.0),
    (formatdate(1_700_000_000, usegmt=True), 1_700_000_100.0, 0.0),   # a past date: retry now
])
def test_parse_retry_after(value, now, expected):
    assert parse_retry_after(value, now) == expected


def one_delivery(outbox, url, body=b'{"n":1}'):
    return outbox.enqueue("sub", url, SECRET, body, now=time.time())


def test_5xx_is_retried_with_the_same_webhook_id_until_delivered():
    ob = Outbox(":memory:")
    with Receiver(script=[("status", 500), ("status", 502), ("status", 503)]) as rx:
        wid = one_delivery(ob, rx.url)
        w = DeliveryWorker(ob, **FAST).start()
        try:
            rx.wait_for(1)
        finally:
            w.stop()
    assert [r.answered for r in rx.requests] == [500, 502, 503, 200]
    assert {r.headers["webhook-id"] for r in rx.requests} == {wid}
    for r in rx.requests:
        assert_signed(r)
    row = ob.get(wid)
    assert (row.state, row.attempts, row.last_status, row.last_error) == ("delivered", 4, 200, None)


def test_429_retry_after_is_honoured():
    ob = Outbox(":memory:")
    with Receiver(script=[("status", 429, {"Retry-After": "1"})]) as rx:
        wid = one_delivery(ob, rx.url)
        w = DeliveryWorker(ob, **FAST).start()
        try:
            rx.wait_for(1)
        finally:
            w.stop()
    first, second = rx.requests
    assert [r.answered for r in rx.requests] == [429, 200]
    # the jittered backoff would have retried within 10 ms; Retry-After asked for a second
    assert second.at - first.at >= 0.95
    assert ob.get(wid).attempts == 2


def test_timeouts_are_retried():
    ob = Outbox(":memory:")
    with Receiver(script=[("sleep", 0.6), ("sleep", 0.6)]) as rx:
        wid = one_delivery(ob, rx.url)
        w = DeliveryWorker(ob, **FAST).start()
        try:
            wait_until(lambda: ob.get(wid).state == "delivered")
        finally:
            w.stop()
    row = ob.get(wid)
    assert row.attempts == 3 and {r.headers["webhook-id"] for r in rx.requests} == {wid}


@pytest.mark.parametrize("code", [400, 401, 404, 410, 422])
def test_other_4xx_fail_at_once_with_the_error(code):
    ob = Outbox(":memory:")
    clock = FakeClock()
    with Receiver(script=[("status", code)]) as rx:
        wid = ob.enqueue("sub", rx.url, SECRET, b'{"n":1}', now=clock())
        w = DeliveryWorker(ob, **{**FAST, "clock": clock}).start()
        try:
            assert w.drain()                            # the first attempt is recorded
            clock.advance(FAST["backoff"].cap_s * 10)   # a retry, if there were one, is due by now
            assert w.drain()
        finally:
            w.stop()
    row = ob.get(wid)
    assert (row.state, row.attempts, row.last_status) == ("failed", 1, code)
    assert row.last_error.startswith(f"HTTP {code}") and len(rx.requests) == 1


def test_dead_letter_after_max_age_keeps_the_last_error():
    ob = Outbox(":memory:")
    wid = one_delivery(ob, f"http://127.0.0.1:{free_port()}/hook")
    w = DeliveryWorker(ob, max_age_s=0.3, **FAST).start()
    try:
        wait_until(lambda: ob.get(wid).state == "dead")
    finally:
        w.stop()
    (dead,) = ob.dead_letters()
    assert dead.webhook_id == wid and dead.attempts >= 3 and "ConnectError" in dead.last_error
    assert ob.state_counts()["dead"] == 1
    assert ob.redeliver(wid, now=time.time()) and ob.get(wid).state == "pending"


def test_stop_is_clean_while_a_receiver_hangs():
    ob = Outbox(":memory:")
    with Receiver(script=[("sleep", 0.5)] * 10) as rx:
        one_delivery(ob, rx.url)
        w = DeliveryWorker(ob, **FAST).start()
        wait_until(lambda: w.inflight == 1)
        t0 = time.time()
        w.stop()
        assert time.time() - t0 < 2.0
        assert not w._thread.is_alive()
    assert ob.get(ob.deliveries()[0].webhook_id).state == "pending"   # nothing lost, retried later


def hosts(n):
    """The host of each of ranks 0..n-1, eight ranks a host."""
    return tuple(f"node{r // 8}" for r in range(n))


def test_down_then_back_across_a_restart_every_alert_arrives_once_per_id(tmp_path):
    """Receivers down, the service restarts (new outbox object, new worker), receivers come back:
    every notification arrives, each under one webhook-id, signed, in its documented shape."""
    db = tmp_path / "svc.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    subs = [Subscription("am", url, format="alertmanager", secret=SECRET),
            Subscription("plain", url, format="json", secret=SECRET)]
    ob1 = Outbox(db)
    w1 = DeliveryWorker(ob1, **FAST).start()
    m = AlertManager(ob1, subscriptions=subs, external_url="http://svc", on_enqueue=w1.wake)
    now = time.time()
    for i in range(6):
        m.process(f"run-{i}", [(Finding("non_finite", step=10 + i, ranks=tuple(range(512)), severity="critical",
                                        metric="loss"), hosts(512))], now)
    expected = {d.webhook_id for d in ob1.deliveries(limit=1000)}
    assert len(expected) == 12   # 6 runs x 2 subscriptions, one each despite 512 ranks
    wait_until(lambda: min(d.attempts for d in ob1.deliveries(limit=1000)) >= 2)   # refused, retried
    w1.stop()
    ob1.close()

    ob2 = Outbox(db)   # the restarted service reads the outbox back
    assert {d.webhook_id for d in ob2.deliveries(state="pending", limit=1000)} == expected
    with Receiver(port=port, script=[("status", 500), ("status", 429, {"Retry-After": "0"}), ("sleep", 0.6)]) as rx:
        w2 = DeliveryWorker(ob2, **FAST).start()
        try:
            wait_until(lambda: ob2.state_counts()["delivered"] == 12)
        finally:
            w2.stop()

    delivered = rx.delivered()
    by_id: dict[str, set[bytes]] = {}
    for r in rx.requests:
        assert_signed(r)
        by_id.setdefault(r.headers["webhook-id"], set()).add(r.body)
    assert set(by_id) == expected                              # every notification arrived ...
    assert all(len(bodies) == 1 for bodies in by_id.values())  # ... each body under ONE id
    assert {r.headers["webhook-id"] for r in delivered} == expected
    am = [json.loads(r.body) for r in delivered if json.loads(r.body).get("version") == "4"]
    assert len({b["groupKey"] for b in am}) == 6
    for body in am:
        jsonschema.validate(body, ALERTMANAGER_V4)
        assert len(body["alerts"]) == 1 and body["alerts"][0]["annotations"]["rank_count"] == "512"


def test_a_page_handed_over_in_its_job_is_sent_once_and_recorded():
    """The manager's job claims the page's row for the worker (reserve) and hands it over once
    durable (take): the receiver gets it once, and the worker's next pass records it."""
    ob = Outbox(":memory:")
    clock = FakeClock()
    with Receiver() as rx:
        w = DeliveryWorker(ob, **{**FAST, "clock": clock}).start()
        m = AlertManager(ob, subscriptions=[Subscription("oncall", rx.url, format="json", secret=SECRET)],
                         on_enqueue=w.wake, hand_off=w)
        try:
            (wid,) = m.process("r", [(Finding("non_finite", step=3, ranks=(0,), severity="critical",
                                              metric="loss"), (None,))], clock())
            claimed_until = ob._read("SELECT claimed_until FROM alert_outbox WHERE webhook_id = ?", (wid,))[0][0]
            assert claimed_until is not None and claimed_until > clock()   # claimed by the job that wrote it
            assert w.drain()
        finally:
            w.stop()
    assert [r.headers["webhook-id"] for r in rx.requests] == [wid]
    row = ob.get(wid)
    assert (row.state, row.attempts) == ("delivered", 1)


def test_a_reservation_whose_job_never_committed_lapses_with_its_claim():
    """A page reserved in a job that rolled back is never handed over: once its claim would
    have run out, its subscription is free again and the worker sends what is due for it."""
    ob = Outbox(":memory:")
    clock = FakeClock()
    with Receiver() as rx:
        w = DeliveryWorker(ob, **{**FAST, "clock": clock}).start()
        try:
            hold = w.reserve("sub", "msg_rolled_back")   # its job failed: no row, no take()
            assert hold is not None and w.reserve("sub", "msg_second") is None   # one in flight a subscription
            wid = ob.enqueue("sub", rx.url, SECRET, b'{"n":1}', now=clock())
            w.wake()
            assert not w.drain(0.3)            # held: the subscription has a reservation in flight
            assert rx.requests == []
            clock.advance(hold)
            assert w.drain()
        finally:
            w.stop()
    assert [r.headers["webhook-id"] for r in rx.requests] == [wid]
