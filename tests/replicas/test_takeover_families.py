"""A fault pushed to a run whose owner was SIGKILLed is found by the survivor, for each family of
detector: values (a NaN), timing (a straggler), absence (a hang). Two replicas over one
PostgreSQL database; after the kill every push goes to the survivor, which does not own the
runs until the dead owner's leases run out. One run's fault is pushed *before* the takeover (the
survivor accepts it and announces it to a replica that is gone), another run's *after* it; each
must be found at its step and paged once, within ``lease_ttl_s`` + 2 s of the takeover or of its
push (a hang: of its timeout). Two runs, not two faults in one: a second NaN of a run is the
first one spreading (blamed on its origin rank, the same latched alert), not a new page.
"""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.alerting.receiver import Receiver
from tests.barriers import wait_until
from tests.pg import fresh_database
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e

TTL_S = 2.0
WORLD = 4
JSON = {"content-type": "application/json"}


def owns(reps: list[ServerProcess], run_id: str) -> bool:
    """Whether one of ``reps`` (the live ones) holds the run's lease, by its /readyz."""
    for rep in reps:
        try:
            if run_id in (httpx.get(rep.url + "/readyz", timeout=2).json().get("leases") or {}):
                return True
        except httpx.HTTPError:
            continue
    return False


def holder(reps: list[ServerProcess], run_id: str) -> ServerProcess | None:
    return next((rep for rep in reps if owns([rep], run_id)), None)


def start_runs(reps: list[ServerProcess], prefix: str, n_steps: int, config: dict | None = None
               ) -> tuple[ServerProcess, list[ServerProcess], dict[str, "Job"]]:
    """Two runs, ``before`` and ``after``, whose leases one replica holds: the one to kill.

    A run's first push may be claimed by another replica's sweep (it adopts running runs that
    have no lease yet), so a pair that landed on two replicas is set aside for a new one."""
    for attempt in range(5):
        runs = {w: Job(reps[0].url, f"{prefix}{attempt}-{w}") for w in ("before", "after")}
        for job in runs.values():
            if config is not None:
                assert job.http.put(f"/v1/runs/{job.run_id}", json=config).status_code in (200, 201)
            job.steps(n_steps)
        def both_held() -> list[ServerProcess] | None:
            held = [holder(reps, j.run_id) for j in runs.values()]
            return held if all(held) else None
        owners = wait_until(both_held, 10, "an owner for both runs")
        if owners[0] is owners[1]:
            return owners[0], [r for r in reps if r is not owners[0]], runs
    raise AssertionError("no replica held both runs in 5 pairs")


def kill_and_redirect(owner: ServerProcess, survivor: ServerProcess, runs: dict[str, "Job"]) -> None:
    """SIGKILL the runs' owner; every push from now on goes to ``survivor``."""
    owner.kill()
    for job in runs.values():
        job.http.base_url = survivor.url


def stored_once(rep: ServerProcess, job: "Job") -> bool:
    cols = httpx.get(f"{rep.url}/v1/runs/{job.run_id}/metrics", params={"fields": "loss"}).json()["columns"]
    stored = list(zip(cols["rank"], cols["step"]))
    return len(stored) == len(set(stored)) and set(stored) == set(job.acked)


class Job:
    """A 4-rank job pushing one step of every rank per request to one replica."""

    def __init__(self, url: str, run_id: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=10, headers=JSON)
        self.run_id, self.step = run_id, 0
        self.acked: list[tuple[int, int]] = []      # (rank, step) of every acknowledged record

    def steps(self, n: int, nan_rank: int | None = None, slow_rank: int | None = None,
              ranks: range = range(WORLD)) -> int:
        """Push ``n`` steps of ``ranks``; the first of them has a NaN loss on ``nan_rank``, every one
        twice the compute time on ``slow_rank``. One second of trainer time (``ts``) a step.
        Returns the first step."""
        first = self.step
        for _ in range(n):
            ranks_ = list(ranks)
            loss = [float("nan") if (r == nan_rank and self.step == first) else 2.0 for r in ranks_]
            body = {"columns": {"step": [self.step] * len(ranks_), "rank": ranks_, "loss": loss,
                                "grad_norm": [1.0] * len(ranks_),
                                "compute_time": [0.2 if r == slow_rank else 0.1 for r in ranks_],
                                "step_time": [0.25] * len(ranks_), "ts": [1_000.0 + self.step] * len(ranks_)}}
            r = self.http.post(f"/v1/runs/{self.run_id}/metrics", content=json.dumps(body))
            assert r.status_code == 202, r.text
            self.acked += [(rank, self.step) for rank in ranks_]
            self.step += 1
        return first


def nan_steps(rep: ServerProcess, run_id: str) -> list[int]:
    found = httpx.get(f"{rep.url}/v1/runs/{run_id}/findings", params={"kind": "non_finite"}).json()
    return sorted(f["step"] for f in found if f["status"] == "firing" and f["metric"] == "loss")


def pages(receiver: Receiver, run_id: str, kind: str) -> list[str]:
    """The webhook ids of the notifications that carried a firing ``kind`` alert of the run."""
    out = []
    for req in receiver.requests:
        body = json.loads(req.body)
        if any(a["kind"] == kind and a["status"] == "firing" and a["labels"]["run"] == run_id
               for a in body["alerts"]):
            out.append(req.headers.get("webhook-id"))
    return out


@pytest.fixture(params=[2, 3], ids=["2-replicas", "3-replicas"])
def pair(tmp_path, request):
    with Receiver() as receiver, fresh_database() as dsn:
        env = {"HEALTHSVC_LEASE_TTL_S": str(TTL_S), "HEALTHSVC_SNAPSHOT_EVERY_S": "1",
               "HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "oncall", "url": receiver.url, "format": "json"}])}
        reps = [ServerProcess(dsn, env=env, log_path=tmp_path / f"replica{i}.log", extra_args=["--log-level", "info"])
                for i in range(request.param)]
        for rep in reps:
            rep.start()
        try:
            yield reps, receiver
        finally:
            for rep in reps:
                rep.stop()


def test_values_a_nan_before_and_after_the_takeover_is_found_and_paged_once(pair):
    reps, receiver = pair
    owner, survivors, runs = start_runs(reps, "tv", 20)
    survivor = survivors[0]      # takes every push after the kill; any survivor may take the runs over

    kill_and_redirect(owner, survivor, runs)
    nan_before = runs["before"].steps(5, nan_rank=1)   # the dead replica still holds the lease
    wait_until(lambda: all(owns(survivors, j.run_id) for j in runs.values()), 3 * TTL_S, "a survivor owning both runs")
    took_over_at = time.monotonic()
    wait_until(lambda: nan_steps(survivor, runs["before"].run_id) == [nan_before], TTL_S + 2,
               "the NaN pushed before the takeover found at its step")
    nan_after = runs["after"].steps(5, nan_rank=2)
    pushed_at = time.monotonic()
    wait_until(lambda: nan_steps(survivor, runs["after"].run_id) == [nan_after], TTL_S + 2,
               "the NaN pushed after the takeover found at its step")
    wait_until(lambda: pages(receiver, runs["before"].run_id, "non_finite") and pages(receiver, runs["after"].run_id, "non_finite"),
               max(0.0, TTL_S + 2 - (time.monotonic() - took_over_at)) + TTL_S + 2, "both NaNs paged")
    assert time.monotonic() - pushed_at <= TTL_S + 2 + 1.0
    # Paged once each: nothing more is owed, so a barrier on the outbox comes first.
    wait_until(lambda: outbox_settled(survivor, receiver), 10, "the survivor's outbox settled")
    assert len(pages(receiver, runs["before"].run_id, "non_finite")) == 1
    assert len(pages(receiver, runs["after"].run_id, "non_finite")) == 1
    assert all(stored_once(survivor, j) for j in runs.values())


def outbox_settled(rep: ServerProcess, receiver: Receiver) -> bool:
    """Nothing pending in the outbox, and the receiver holds every delivered page."""
    counts = httpx.get(f"{rep.url}/v1/webhooks/oncall/deliveries").json()["counts"]
    return counts["pending"] == 0 and len(receiver.requests) >= counts["delivered"] > 0


def stragglers(rep: ServerProcess, run_id: str) -> list[tuple[int, list[int], str, int]]:
    found = httpx.get(f"{rep.url}/v1/runs/{run_id}/findings", params={"kind": "straggler"}).json()
    return [(f["step"], f["ranks"], f["severity"], f["onset_step"]) for f in found if f["status"] == "firing"]


def test_timing_a_straggler_before_and_after_the_takeover_is_found_and_paged_once(pair):
    reps, receiver = pair
    owner, survivors, runs = start_runs(reps, "tt", 60)
    survivor = survivors[0]      # takes every push after the kill; any survivor may take the runs over

    kill_and_redirect(owner, survivor, runs)
    # Rank 2 twice as slow from step 60: named (info) at 63, critical once it lasted 30 s of
    # trainer time, at 93 (the same trace on one server finds the same).
    runs["before"].steps(40, slow_rank=2)
    wait_until(lambda: all(owns(survivors, j.run_id) for j in runs.values()), 3 * TTL_S, "a survivor owning both runs")
    wait_until(lambda: len(stragglers(survivor, runs["before"].run_id)) == 2, TTL_S + 2, "the straggler pushed before found")
    assert stragglers(survivor, runs["before"].run_id) == [(63, [2], "info", 60), (93, [2], "critical", 60)]
    runs["after"].steps(40, slow_rank=2)
    wait_until(lambda: len(stragglers(survivor, runs["after"].run_id)) == 2, TTL_S + 2, "the straggler pushed after found")
    assert stragglers(survivor, runs["after"].run_id) == [(63, [2], "info", 60), (93, [2], "critical", 60)]
    wait_until(lambda: pages(receiver, runs["before"].run_id, "straggler") and pages(receiver, runs["after"].run_id, "straggler"),
               TTL_S + 2, "both stragglers paged")
    wait_until(lambda: outbox_settled(survivor, receiver), 10, "the survivor's outbox settled")
    assert len(pages(receiver, runs["before"].run_id, "straggler")) == 1
    assert len(pages(receiver, runs["after"].run_id, "straggler")) == 1
    assert all(stored_once(survivor, j) for j in runs.values())


HANG_S = 3.0


class Steady(threading.Thread):
    """Ranks 0-2 of a run go on pushing a step every 0.1 s until ``stop``."""

    def __init__(self, job: Job, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.job, self.stop = job, stop

    def run(self) -> None:
        while not self.stop.is_set():
            self.job.steps(1, ranks=range(WORLD - 1))
            self.stop.wait(0.1)


def hangs(rep: ServerProcess, run_id: str) -> list[tuple[list[int], float]]:
    found = httpx.get(f"{rep.url}/v1/runs/{run_id}/findings", params={"kind": "hang"}).json()
    return [(f["ranks"], f["created_at"]) for f in found if f["status"] == "firing"]


def test_absence_a_rank_hanging_before_and_after_the_takeover_is_found_and_paged_once(pair):
    reps, receiver = pair
    owner, survivors, runs = start_runs(reps, "ta", 20, config={"world_size": WORLD, "detectors": {
        "hang": {"timeout_floor_s": HANG_S, "startup_timeout_s": HANG_S}}})
    survivor = survivors[0]      # takes every push after the kill; any survivor may take the runs over

    stop = threading.Event()
    kill_and_redirect(owner, survivor, runs)
    # Rank 3 of ta-before is silent from the kill on; rank 3 of ta-after once the survivor owns it.
    silent_before = time.time()
    others = [Steady(runs["before"], stop)]
    others[0].start()
    try:
        wait_until(lambda: all(owns(survivors, j.run_id) for j in runs.values()), 3 * TTL_S,
                   "a survivor owning both runs")
        runs["after"].steps(1)
        silent_after = time.time()
        others.append(Steady(runs["after"], stop))
        others[1].start()
        wait_until(lambda: hangs(survivor, runs["before"].run_id), HANG_S + TTL_S + 2, "the hang from before the takeover")
        wait_until(lambda: hangs(survivor, runs["after"].run_id), HANG_S + 2 + 1, "the hang from after the takeover")
    finally:
        stop.set()
        for t in others:
            t.join(10)
    (ranks, at), = hangs(survivor, runs["before"].run_id)
    assert ranks == [3] and at - silent_before <= HANG_S + TTL_S + 2
    (ranks, at), = hangs(survivor, runs["after"].run_id)
    assert ranks == [3] and at - silent_after <= HANG_S + 2
    wait_until(lambda: pages(receiver, runs["before"].run_id, "hang") and pages(receiver, runs["after"].run_id, "hang"), 5,
               "both hangs paged")
    wait_until(lambda: outbox_settled(survivor, receiver), 10, "the survivor's outbox settled")
    assert len(pages(receiver, runs["before"].run_id, "hang")) == 1 and len(pages(receiver, runs["after"].run_id, "hang")) == 1
    assert all(stored_once(survivor, j) for j in runs.values())
