"""A run whose snapshot costs the run's owner long is snapshotted less often (``snapshot_wait``
in ``healthsvc.monitor.hub``): snapshots take at most a fixed share of the owner's time, so a
page rarely waits behind one. The cost is measured on a clock the test moves, so a snapshot
'costs' exactly what the test says."""
from __future__ import annotations

import json

from healthsvc.monitor.hub import SNAPSHOT_COST_RATIO, _load_state
from tests.harness import InProcessService

JSON = {"content-type": "application/json"}


class CostClock:
    """Each reading is ``per_call`` seconds after the last: a snapshot (two readings) costs that."""

    def __init__(self, per_call: float) -> None:
        self.now, self.per_call = 0.0, per_call

    def __call__(self) -> float:
        self.now += self.per_call
        return self.now


def saved_at(svc) -> float | None:
    snap = svc.app.state.store.snapshot("r", "monitor")
    return None if snap is None else _load_state(snap.state)["saved_at"]


def push(svc, step: int) -> None:
    body = {"columns": {"step": [step, step], "rank": [0, 1], "loss": [1.0, 1.0]}}
    assert svc.http.post("/v1/runs/r/metrics", content=json.dumps(body), headers=JSON).status_code == 202


def snapshot_times(svc, seconds: int) -> list[float]:
    """Push a step a second for ``seconds``; the distinct times the run's snapshot was saved at."""
    times: list[float] = []
    for step in range(seconds):
        push(svc, step)
        svc.advance(1.0)
        t = saved_at(svc)
        if t is not None and (not times or t != times[-1]):
            times.append(t)
    return times


def test_a_costly_snapshot_is_followed_by_a_longer_wait(tmp_path):
    with InProcessService(tmp_path, snapshot_every_s=5.0) as svc:
        svc.monitor._cost_clock = CostClock(0.5)    # every snapshot costs the owner 0.5 s
        times = snapshot_times(svc, 120)
        assert len(times) == 3
        assert [b - a for a, b in zip(times, times[1:])] == [SNAPSHOT_COST_RATIO * 0.5] * 2


def test_a_quick_snapshot_keeps_the_set_interval(tmp_path):
    with InProcessService(tmp_path, snapshot_every_s=5.0) as svc:
        svc.monitor._cost_clock = CostClock(0.01)   # below the floor: the machine's noise
        times = snapshot_times(svc, 30)
        assert len(times) >= 5 and all(b - a == 5.0 for a, b in zip(times, times[1:]))
