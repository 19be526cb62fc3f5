"""A fault judged late is paged as it would have been live.

A run's owner judges pushes late when it replays them: after a takeover (the soak's ``soak-5``:
its owner SIGKILLed, the successor replayed ten steps of a loss spike in a quarter of a second)
or a restart, through the same restore. Alerts are timed by when the data that raised them
arrived, not by when the owner folded the findings: folded at the replay's pace, a lasting
warning fires and clears inside its group's wait, which is Alertmanager's rule for a blip that
is never paged.

Here the run's data reaches a storage-only service (detection off) one step a second on the test's
clock; the service restarts with detection on and replays it all at once. A x3 loss spike of 15
steps is a warning from its first step to its recovery (it would turn critical, which pages at
once, after 20); it lasts three times its group's wait (5 s here): it is paged, as the same
pushes are paged live. (On
SQLite: with PostgreSQL, runs are owned by leases and a run is claimed by its activity, so the
replay comes with a takeover: ``tests/replicas/test_replayed_paging.py``.)
"""
from __future__ import annotations

import json

import pytest

from simulation import LossSpike, simulate_run
from tests.alerting.receiver import Receiver
from tests.harness import FakeClock, InProcessService
from tests.pushes import step_pushes

pytestmark = [pytest.mark.timeout(180)]

N_RANKS = 4
SPIKE_AT, SPIKE_STEPS, N_STEPS = 150, 15, 200
# A warning's first flush 5 s after it fires (the default is 30 s): the spike lasts 15 s.
TIMINGS = {"warning": {"group_wait_s": 5.0}}


def step_bodies() -> list[bytes]:
    """One columnar push a step: a run whose loss jumps x3 for 15 steps at step 150."""
    return step_pushes(simulate_run(n_steps=N_STEPS, n_ranks=N_RANKS, seed=3, warmup_steps=10,
                                    faults=[LossSpike(step=SPIKE_AT, factor=3.0, duration=SPIKE_STEPS)]).block)


def push_a_step_a_second(svc, bodies: list[bytes], *, live: bool) -> None:
    """The run's steps, then its finish (a run that stopped without one would stall too)."""
    for body in bodies:
        r = svc.http.post("/v1/runs/r/metrics", content=body)
        assert r.status_code == 202, r.text
        if live:
            svc.advance(1.0)          # the service's time-driven checks run every second
        else:
            svc.clock.advance(1.0)    # nothing of it is judged: no checks to run
    assert svc.http.post("/v1/runs/r/finish").status_code < 300


def loss_spike_pages(rx: Receiver) -> list[tuple[str, str]]:
    """(status, alert status) of every loss-spike alert the receiver was sent, in order."""
    out = []
    for r in rx.delivered():
        doc = json.loads(r.body)
        out += [(doc["status"], a["status"]) for a in doc["alerts"] if a["labels"]["alertname"] == "loss_spike"]
    return out


def spikes(svc) -> list[tuple[int, str, str]]:
    return [(f["step"], f["severity"], f["status"])
            for f in svc.http.get("/v1/runs/r/findings", params={"kind": "loss_spike"}).json()]


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> tuple[list, list]:
    """The run judged live, each step as it arrives: its loss-spike findings and pages."""
    with Receiver() as rx:
        hooks = [{"id": "oncall", "url": rx.url, "format": "alertmanager"}]
        with InProcessService(tmp_path_factory.mktemp("live"), alert_webhooks=hooks, alert_timings=TIMINGS) as svc:
            push_a_step_a_second(svc, step_bodies(), live=True)
            svc.advance(60)
            found = spikes(svc)
        pages = loss_spike_pages(rx)
    assert found == [(SPIKE_AT, "warning", "firing"), (SPIKE_AT + SPIKE_STEPS, "info", "resolved")], found
    assert pages and pages[0] == ("firing", "firing"), pages
    return found, pages


def test_a_lasting_warning_replayed_at_once_is_paged_as_it_was_live(live, tmp_path):
    live_findings, live_pages = live
    clock = FakeClock()
    with Receiver() as rx:
        hooks = [{"id": "oncall", "url": rx.url, "format": "alertmanager"}]
        with InProcessService(tmp_path, clock=clock, detect=False, alert_webhooks=hooks,
                              alert_timings=TIMINGS) as svc:
            push_a_step_a_second(svc, step_bodies(), live=False)
            svc.drain()
        # Restarted with its detectors: the whole run is replayed at once, within a few ms of
        # the test's clock (it does not move until the replay is stored).
        with InProcessService(tmp_path, clock=clock, alert_webhooks=hooks, alert_timings=TIMINGS) as svc:
            svc.drain(tick=True)
            assert spikes(svc) == live_findings   # the same findings, at the same steps
            svc.advance(60)
        assert loss_spike_pages(rx) == live_pages
