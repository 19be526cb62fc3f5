"""A lasting warning pushed while its run's owner is dead is paged after the takeover.

The soak's ``soak-5``: the replica that owned a run was SIGKILLed; the rest of a ten-step loss
spike, its end included, was pushed to another replica, which stores a push to a run it does not
own and announces it (to the dead owner); once the dead owner's lease ran out that replica took
the run over and replayed the whole spike at once. Its alert fired and cleared 0.24 s apart,
inside its group's wait, and was never paged. Alerts are timed by when the data that raised them
arrived, so the replay pages it as the same pushes would have live.

Two real replicas over one PostgreSQL database. A x3 loss spike of 15 steps is a warning from its
first step to its recovery (it would turn critical, which pages at once, after 20). The
warning's group wait is 0.3 s here and the spike's steps are pushed 0.05 s apart, all before the
takeover (checked): judged live, the alert fires and clears more than a group wait apart.
"""
from __future__ import annotations

import json
import time

import httpx
import pytest

from simulation import LossSpike, simulate_run
from tests.alerting.receiver import Receiver
from tests.barriers import wait_until
from tests.pg import fresh_database
from tests.pushes import step_pushes
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e

TTL_S = 8.0          # long enough for the spike's pushes to land before the takeover
WORLD = 4
SPIKE_AT, SPIKE_STEPS, N_STEPS = 120, 15, 160
PACE_S = 0.05        # between two steps' pushes while the spike lasts (a trainer's pace, not a wait)
JSON = {"content-type": "application/json"}


def leases_of(rep: ServerProcess) -> dict:
    return httpx.get(rep.url + "/readyz", timeout=5).json().get("leases") or {}


def bodies() -> list[bytes]:
    return step_pushes(simulate_run(n_steps=N_STEPS, n_ranks=WORLD, seed=3, warmup_steps=10,
                                    faults=[LossSpike(step=SPIKE_AT, factor=3.0, duration=SPIKE_STEPS)]).block)


def loss_spike_pages(receiver: Receiver, run_id: str) -> list[str]:
    out = []
    for req in receiver.requests:
        body = json.loads(req.body)
        out += [a["status"] for a in body["alerts"] if a["kind"] == "loss_spike" and a["labels"]["run"] == run_id]
    return out


def test_a_loss_spike_pushed_while_its_owner_is_dead_is_paged_after_the_takeover(tmp_path):
    steps = bodies()
    with Receiver() as receiver, fresh_database() as dsn:
        env = {"HEALTHSVC_LEASE_TTL_S": str(TTL_S), "HEALTHSVC_SNAPSHOT_EVERY_S": "1",
               "HEALTHSVC_ALERT_TIMINGS": json.dumps({"warning": {"group_wait_s": 0.3}}),
               "HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "oncall", "url": receiver.url, "format": "json",
                                                                "resend_interval_s": 1}])}
        reps = [ServerProcess(dsn, env=env, log_path=tmp_path / f"replica{i}.log") for i in range(2)]
        for rep in reps:
            rep.start()
        try:
            run_id = "spike"
            with httpx.Client(base_url=reps[0].url, timeout=10, headers=JSON) as http:
                for body in steps[:SPIKE_AT]:   # the run's history, judged live by its owner
                    assert http.post(f"/v1/runs/{run_id}/metrics", content=body).status_code == 202
            owner = wait_until(lambda: next((r for r in reps if run_id in leases_of(r)), None), 10, "an owner")
            survivor = next(r for r in reps if r is not owner)
            owner.kill()
            with httpx.Client(base_url=survivor.url, timeout=10, headers=JSON) as http:
                for i, body in enumerate(steps[SPIKE_AT:]):
                    assert http.post(f"/v1/runs/{run_id}/metrics", content=body).status_code == 202
                    if i <= SPIKE_STEPS:
                        time.sleep(PACE_S)
                assert run_id not in leases_of(survivor), "taken over mid-spike: the replay would not be at once"
                wait_until(lambda: run_id in leases_of(survivor), 3 * TTL_S, "the survivor to take the run over")

                def spike_cleared() -> list | None:
                    found = http.get(f"/v1/runs/{run_id}/findings", params={"kind": "loss_spike"}).json()
                    return found if any(f["status"] == "resolved" for f in found) else None
                found = wait_until(spike_cleared, TTL_S + 2, "the spike found and cleared by the survivor's replay")
            # A warning, never critical (which is paged at once, even when folded with its end).
            assert [(f["step"], f["severity"], f["status"]) for f in found] == [
                (SPIKE_AT, "warning", "firing"), (SPIKE_AT + SPIKE_STEPS, "info", "resolved")]
            wait_until(lambda: loss_spike_pages(receiver, run_id), 5, "the warning paged")
            wait_until(lambda: "resolved" in loss_spike_pages(receiver, run_id), 10, "its resolution sent")
            assert loss_spike_pages(receiver, run_id) == ["firing", "resolved"]
        finally:
            for rep in reps:
                rep.stop()
