"""Receivers that hang do not delay anyone else's pages.

One server, three subscriptions: ``slow`` answers after 30 s (longer than the delivery timeout,
so each attempt there times out and is retried), ``silent`` accepts the connection and never
answers, ``oncall`` is healthy. Several runs page first, so the bad receivers have more
deliveries in flight and in retry than the worker has sender threads; then a NaN of a fresh run
must still reach ``oncall`` within ``BOUND_S`` of its push, and every NaN page must reach it once.
"""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.alerting.receiver import Receiver
from tests.barriers import wait_until
from tests.faults.silent_receiver import SilentReceiver
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e

BOUND_S = 2.0          # a critical page goes out at once (group_wait 0): 2 s is generous
WARM_RUNS = 6          # pages queued for the bad receivers first: more than the worker's senders


def push_nan(url: str, run_id: str) -> None:
    """Two ranks, three steps; rank 1's loss is NaN at step 2."""
    body = {"columns": {"step": [0, 0, 1, 1, 2, 2], "rank": [0, 1] * 3,
                        "loss": [2.0, 2.0, 2.0, 2.0, 2.0, float("nan")]}}
    r = httpx.post(f"{url}/v1/runs/{run_id}/metrics", content=json.dumps(body),
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 202, r.text


def runs_paged(receiver: Receiver) -> list[str]:
    """The run of every firing non_finite alert the receiver got, one entry per notification."""
    out = []
    for req in receiver.delivered():
        for alert in json.loads(req.body)["alerts"]:
            if alert["kind"] == "non_finite" and alert["status"] == "firing":
                out.append(alert["labels"]["run"])
    return out


def test_a_slow_and_a_silent_receiver_do_not_delay_a_healthy_ones_pages(tmp_path):
    slow_script = [("sleep", 30.0)] * 100
    with Receiver(script=slow_script) as slow, SilentReceiver() as silent, Receiver() as oncall:
        hooks = [{"id": "slow", "url": slow.url, "format": "json"},
                 {"id": "silent", "url": silent.url, "format": "json"},
                 {"id": "oncall", "url": oncall.url, "format": "json"}]
        env = {"HEALTHSVC_ALERT_WEBHOOKS": json.dumps(hooks), "HEALTHSVC_ALERT_DELIVERY_TIMEOUT_S": "10"}
        with ServerProcess(tmp_path / "hs.db", env=env, log_path=tmp_path / "server.log") as server:
            for i in range(WARM_RUNS):
                push_nan(server.url, f"warm-{i}")
            wait_until(lambda: len(silent.accepted) >= 1, 10, "the silent receiver holding a connection")
            wait_until(lambda: len(set(runs_paged(oncall))) == WARM_RUNS, 10 + BOUND_S, "the warm-up pages at oncall")

            pushed = time.monotonic()
            push_nan(server.url, "late")
            wait_until(lambda: "late" in runs_paged(oncall), 15, "the late run paged to oncall", interval_s=0.02)
            took_s = time.monotonic() - pushed
            assert took_s <= BOUND_S, f"the late page took {took_s:.1f} s behind the bad receivers"
            # The bound held while the bad receivers were bad: neither has had a page through.
            for bad in ("slow", "silent"):
                assert httpx.get(f"{server.url}/v1/webhooks/{bad}/deliveries").json()["counts"]["delivered"] == 0
            wait_until(lambda: httpx.get(f"{server.url}/v1/webhooks/oncall/deliveries").json()["counts"]["pending"] == 0,
                       5, "oncall's outbox settled")
            assert sorted(runs_paged(oncall)) == sorted([f"warm-{i}" for i in range(WARM_RUNS)] + ["late"])
