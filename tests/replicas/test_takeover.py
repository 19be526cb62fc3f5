"""Three replicas on one PostgreSQL database behind nginx (the shipped config), concurrent pushers, and
the replica that owns the run killed (SIGKILL) in the middle of the load.

What must hold: every acknowledged record is stored; the findings go on after the takeover, none
twice; the alert fired before the kill is not sent again and the one fired after it is sent once
(a real HTTP receiver); a rank that stops is found hanging within its timeout plus the lease TTL.

Times are the test's settings: lease TTL 2 s, hang timeout 3 s. Waits are polls with a deadline
on what the test observes (the receiver's requests, the replicas' /readyz), never a sleep.
"""
from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from tests.alerting.receiver import Receiver
from tests.barriers import wait_until
from tests.pg import fresh_database
from tests.replicas.balancer import Balancer
from tests.server_process import ServerProcess, free_port

pytestmark = pytest.mark.e2e

TTL_S = 2.0
HANG_S = 3.0
WORLD = 8
STEP_S = 0.05        # each rank pushes a step every 50 ms
NAN_STEP = 20        # rank 5's loss is NaN at this step: a critical non_finite alert
STUCK_RANK = 7       # stops pushing after the kill: a hang


class Pusher(threading.Thread):
    """One rank pushing a step at a time through the balancer; a push counts once it is
    acknowledged (202), retried with the same body (the same digest) until then."""

    def __init__(self, url: str, rank: int, stop: threading.Event, stuck: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.rank, self.stop, self.stuck = url, rank, stop, stuck
        self.acked: list[int] = []
        self.last_push_at = 0.0
        self.errors = 0

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10, headers={"content-type": "application/json"}) as http:
            step = 0
            while not self.stop.is_set() and not (self.stuck is not None and self.stuck.is_set()):
                loss = float("nan") if (step == NAN_STEP and self.rank == 5) else 2.0 / math.sqrt(step + 1)
                body = json.dumps({"columns": {"step": [step], "rank": [self.rank], "loss": [loss]}}).encode()
                acked = False
                while not acked and not self.stop.is_set():
                    try:
                        acked = http.post("/v1/runs/r1/metrics", content=body).status_code == 202
                    except httpx.HTTPError:
                        pass
                    self.errors += not acked
                if not acked:
                    return
                self.acked.append(step)
                self.last_push_at = time.time()
                step += 1
                self.stop.wait(STEP_S)


def notifications(receiver: Receiver) -> list[dict]:
    return [json.loads(r.body) for r in receiver.requests]


def kinds_sent(receiver: Receiver) -> list[tuple[str, list[str]]]:
    """(reason, firing kinds) of each notification received, in order."""
    return [(n["reason"], sorted(a["kind"] for a in n["alerts"] if a["status"] == "firing"))
            for n in notifications(receiver)]


def owner_of(replicas: list[ServerProcess], run_id: str) -> ServerProcess | None:
    for rep in replicas:
        if rep.proc.poll() is None:
            try:
                ready = httpx.get(rep.url + "/readyz", timeout=2).json()
            except httpx.HTTPError:
                continue
            if run_id in (ready.get("leases") or {}):
                return rep
    return None


@pytest.fixture
def cluster(tmp_path):
    with Receiver() as receiver, fresh_database() as dsn:
        env = {"HEALTHSVC_LEASE_TTL_S": str(TTL_S), "HEALTHSVC_SNAPSHOT_EVERY_S": "1",
               # A changed group is paged again after 1 s, not 10: the hang page follows its finding.
               "HEALTHSVC_ALERT_TIMINGS": json.dumps({"critical": {"group_interval_s": 1.0}}),
               "HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "oncall", "url": receiver.url,
                                                        "format": "json"}])}
        replicas = [ServerProcess(dsn, env=env, log_path=tmp_path / f"replica{i}.log", extra_args=["--log-level", "info"])
                    for i in range(3)]
        replicas[0].start()          # the first one migrates the fresh database
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda r: r.start(), replicas[1:]))
        balancer = Balancer(tmp_path / "nginx", free_port(), [r.port for r in replicas]).start()
        try:
            yield dsn, replicas, balancer, receiver
        finally:
            balancer.stop()
            for rep in replicas:
                rep.stop()


def test_sigkill_of_the_owner_mid_load_loses_nothing_and_repeats_nothing(cluster):
    dsn, replicas, balancer, receiver = cluster
    http = httpx.Client(base_url=balancer.url, timeout=10)
    assert http.put("/v1/runs/r1", json={
        "world_size": WORLD,
        "detectors": {"hang": {"timeout_floor_s": HANG_S, "startup_timeout_s": HANG_S}}}).status_code in (200, 201)

    stop, stuck = threading.Event(), threading.Event()
    pushers = [Pusher(balancer.url, r, stop, stuck if r == STUCK_RANK else None) for r in range(WORLD)]
    for p in pushers:
        p.start()
    try:
        # Before the kill: the NaN is found and paged, once.
        wait_until(lambda: any("non_finite" in k for _, k in kinds_sent(receiver)), 20, "the non_finite page")
        owner = wait_until(lambda: owner_of(replicas, "r1"), 10, "an owner of r1 in /readyz")
        refused_before_kill = sum(p.errors for p in pushers)   # any replica takes any push
        owner.kill()
        killed_at = time.time()
        stuck.set()                      # rank 7 hangs from now on; the others go on
        stuck_since = pushers[STUCK_RANK].last_push_at

        survivors = [r for r in replicas if r is not owner]
        new_owner = wait_until(lambda: owner_of(survivors, "r1"), 3 * TTL_S, "a surviving replica owning r1")
        # The hang is paged by the new owner within the timeout plus the TTL (plus one tick
        # and the delivery's round trip).
        wait_until(lambda: any("hang" in k for _, k in kinds_sent(receiver)), HANG_S + TTL_S + 10, "the hang page")
    finally:
        stop.set()
        for p in pushers:
            p.join(10)

    assert refused_before_kill == 0

    # Every acknowledged record is stored (read through the balancer: any replica answers).
    stored = http.get("/v1/runs/r1/metrics", params={"fields": "loss"}).json()["columns"]
    have = set(zip(stored["rank"], stored["step"]))
    missing = [(p.rank, s) for p in pushers for s in p.acked if (p.rank, s) not in have]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"

    # Findings: on after the takeover, none twice.
    found = http.get("/v1/runs/r1/findings", params={"limit": 100_000}).json()
    keys = [(f["attempt"], f["kind"], f["step"], tuple(f["ranks"]), f["metric"], f["status"]) for f in found]
    assert len(keys) == len(set(keys)), "a finding stored twice"
    hangs = [f for f in found if f["kind"] in ("hang", "stall") and f["status"] == "firing"]
    assert hangs and STUCK_RANK in hangs[0]["ranks"]
    assert hangs[0]["created_at"] > killed_at
    # Found within the timeout plus the TTL of the rank's last push (plus a tick, 1 s).
    late = hangs[0]["created_at"] - stuck_since
    assert late <= HANG_S + TTL_S + 1.0, f"hang found {late:.1f} s after rank {STUCK_RANK}'s last push"

    # Alerts: wait until the outbox has nothing pending (every enqueued page delivered), then
    # the receiver holds each page once: the NaN page before the kill, the hang page after it,
    # and no page again for the NaN (the new owner loaded what the dead one had sent).
    def outbox_settled() -> bool:
        with psycopg.connect(dsn) as conn:
            pending = conn.execute("SELECT count(*) FROM alert_outbox WHERE state = 'pending'").fetchone()[0]
            total = conn.execute("SELECT count(*) FROM alert_outbox").fetchone()[0]
        return pending == 0 and len(receiver.requests) >= total
    wait_until(outbox_settled, 15, "every enqueued page delivered")
    ids = [r.headers.get("webhook-id") for r in receiver.requests]
    assert len(ids) == len(set(ids)), "a page delivered twice"
    sent = kinds_sent(receiver)
    assert [k for _, k in sent if k == ["non_finite"]] == [["non_finite"]], sent
    assert sum("hang" in k for _, k in sent) == 1, sent
    assert new_owner is not owner
    # /metrics of the new owner shows its lease of r1, in a newer epoch than the dead owner's.
    metrics = httpx.get(new_owner.url + "/metrics").text
    token = next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                 if line.startswith("healthsvc_lease_token{") and 'run="r1"' in line)
    assert token >= 2

    # An operator acknowledges the hang on a replica that does not own the run: every replica
    # answers it acknowledged, the owner too (it reloaded the run's alerts when told).
    hang_fp = next(a["fingerprint"] for n in notifications(receiver) for a in n["alerts"] if a["kind"] == "hang")
    other = next(r for r in survivors if r is not new_owner)
    assert httpx.post(f"{other.url}/v1/alerts/{hang_fp}/acknowledge", json={"by": "oncall"}).status_code == 200
    for rep in survivors:
        wait_until(lambda: httpx.get(f"{rep.url}/v1/alerts/{hang_fp}").json()["acknowledged_by"] == "oncall", 5,
                   f"the acknowledgement seen on {rep}")
