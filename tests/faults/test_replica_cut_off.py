"""A replica cut off from the database: a frozen TCP proxy between replica A and PostgreSQL
(nothing forwarded, nothing closed), replica B connected directly, leases of ``TTL_S``.

A owns the run when the network freezes. A must stop acting on its lease before it expires in
the database (its /readyz lists no lease for the run before B's lists one: fencing) while its own
pushes are answered 503 (not left hanging), B takes the
run over and finds a NaN pushed to it during the cut, and once the network thaws (A's queued
writes reach the database) A writes nothing over B's work: B keeps the run, the NaN is one
finding and one page, and every acknowledged record is stored once.
"""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from healthsvc.ingest.committed import WRITE_WAIT_S
from tests.alerting.receiver import Receiver
from tests.barriers import wait_until
from tests.faults.proxy import FreezableProxy
from tests.pg import fresh_database
from tests.replicas.test_takeover_families import Job, nan_steps, pages, stored_once
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e

TTL_S = 2.0


def leases(rep: ServerProcess) -> dict[str, int] | None:
    """The runs ``rep`` says it acts on (its /readyz, ready or not); None if it did not answer."""
    try:
        return httpx.get(rep.url + "/readyz", timeout=3).json().get("leases") or {}
    except httpx.HTTPError:
        return None


class Watch(threading.Thread):
    """Polls a replica's /readyz for one run's lease, keeping when each answer was sent and got."""

    def __init__(self, rep: ServerProcess, run_id: str) -> None:
        super().__init__(daemon=True)
        self.rep, self.run_id, self.stop = rep, run_id, threading.Event()
        self.answers: list[tuple[float, float, bool]] = []      # (sent, got, holds the lease)

    def run(self) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            held = leases(self.rep)
            if held is not None:
                self.answers.append((sent, time.monotonic(), self.run_id in held))
            self.stop.wait(0.02)

    def first_held(self) -> float | None:
        """When the first answer that lists the lease was *sent* (the lease was its after that)."""
        return next((sent for sent, _, held in self.answers if held), None)

    def last_held(self) -> float | None:
        """When the last answer that lists the lease was *got* (it was let go after that, at most)."""
        return max((got for _, got, held in self.answers if held), default=None)

    def __enter__(self) -> "Watch":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.join(10)


def outbox_settled(rep: ServerProcess) -> bool:
    counts = httpx.get(f"{rep.url}/v1/webhooks/oncall/deliveries", timeout=5).json()["counts"]
    return counts["pending"] == 0 and counts["delivered"] > 0


@pytest.fixture
def cut(tmp_path):
    with Receiver() as receiver, fresh_database() as dsn:
        host_port = int(dsn.rsplit(":", 1)[1].split("/")[0])
        with FreezableProxy(host_port) as proxy:
            env = {"HEALTHSVC_LEASE_TTL_S": str(TTL_S), "HEALTHSVC_SNAPSHOT_EVERY_S": "1",
                   "HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "oncall", "url": receiver.url, "format": "json"}])}
            proxied = dsn.replace(f":{host_port}/", f":{proxy.port}/")
            a = ServerProcess(proxied, env=env, log_path=tmp_path / "a.log", extra_args=["--log-level", "info"])
            b = ServerProcess(dsn, env=env, log_path=tmp_path / "b.log", extra_args=["--log-level", "info"])
            a.start()
            b.start()
            try:
                yield a, b, proxy, receiver
            finally:
                proxy.thaw()
                for rep in (a, b):
                    rep.stop()


def test_a_replica_cut_off_lets_its_leases_go_and_writes_nothing_over_the_new_owner(cut):
    a, b, proxy, receiver = cut
    for attempt in range(5):   # B's sweep may adopt a new run first: then another run
        job = Job(a.url, f"cut-{attempt}")
        job.steps(10)
        wait_until(lambda: job.run_id in (leases(a) or {}) or job.run_id in (leases(b) or {}), 10, "an owner")
        if job.run_id in (leases(a) or {}):
            break
    else:
        raise AssertionError("replica A never owned a run")

    # Fencing: A lets the lease go (its own clock) before B can take it (the database's).
    with Watch(a, job.run_id) as watch_a, Watch(b, job.run_id) as watch_b:
        wait_until(watch_a.last_held, 5, "A seen owning the run")
        proxy.freeze()
        frozen_at = time.monotonic()
        job.http.base_url = b.url          # the balancer sends the pushes to the replica that answers
        nan_step = job.steps(5, nan_rank=1)
        # A's own writes wait on a database that does not answer: a 503 in bounded time, not a hang.
        for path, body in (("metrics", {"records": [{"step": 0, "rank": 0, "loss": 1.0}]}),
                           ("heartbeats", {"rank": 0, "step": 0})):
            sent = time.monotonic()
            r = httpx.post(f"{a.url}/v1/runs/side/{path}", json=body, timeout=WRITE_WAIT_S + 5)
            assert r.status_code == 503 and "not committed" in r.text, (path, r.status_code, r.text)
            assert time.monotonic() - sent <= WRITE_WAIT_S + 1, path
        b_took = wait_until(watch_b.first_held, 3 * TTL_S + 5, "B owning the run")
        a_last = watch_a.last_held()
    assert a_last < b_took, f"A said it held the lease {a_last - b_took:.2f} s after B said it did"
    assert a_last - frozen_at <= TTL_S, "A acted on the lease for longer than its ttl without renewing it"
    wait_until(lambda: nan_steps(b, job.run_id) == [nan_step], TTL_S + 3, "the NaN found by B")
    wait_until(lambda: pages(receiver, job.run_id, "non_finite"), 5, "the NaN paged")

    proxy.thaw()
    wait_until(lambda: httpx.get(a.url + "/readyz", timeout=3).status_code == 200, 15, "A ready again")
    after = job.steps(5)
    assert job.run_id not in (leases(a) or {}) and job.run_id in (leases(b) or {}), "B keeps the run"
    wait_until(lambda: outbox_settled(b), 10, "B's outbox settled")
    assert nan_steps(b, job.run_id) == [nan_step] and nan_steps(a, job.run_id) == [nan_step]
    assert len(pages(receiver, job.run_id, "non_finite")) == 1
    assert stored_once(b, job)
    assert after == nan_step + 5
