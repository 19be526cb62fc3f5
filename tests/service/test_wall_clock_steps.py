"""Monotonic time (issue 12, finding 8): steps of the wall clock move no timeout. The service runs
in-process on the real :class:`ServiceClock` fed by a wall clock the test steps (the real system
clock is left alone) and a monotonic clock the test advances (``tests/harness.py``), on default
detector settings."""
from __future__ import annotations

import time

import pytest

from starlette.testclient import TestClient

from healthsvc.app import create_app
from healthsvc.clock import ServiceClock
from healthsvc.settings import Settings
from tests.harness import FakeClock, InProcessService

pytestmark = pytest.mark.both_stores

HANG_FLOOR_S = 60.0   # the hang detector's default timeout floor


class SteppableWall:
    """The system's wall clock plus an offset the test changes (a `date -s` without root)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


class SteppedServiceClock(ServiceClock):
    """The service's clock over a steppable wall and a monotonic clock that moves by advance()."""

    def __init__(self, wall: SteppableWall) -> None:
        self.mono = FakeClock(start=1000.0)
        super().__init__(wall=wall, mono=self.mono)

    def advance(self, seconds: float) -> float:
        self.mono.advance(seconds)
        return self()


def _push(c: TestClient, step: int, ranks: list[int]) -> None:
    body = {"columns": {"step": [step] * len(ranks), "rank": ranks, "loss": [1.0] * len(ranks)}}
    assert c.post("/v1/runs/w/metrics", json=body).status_code == 202


def _absence_findings(c: TestClient) -> list[dict]:
    return [f for f in c.get("/v1/runs/w/findings").json() if f["kind"] in ("hang", "stall")]


def test_wall_clock_steps_raise_no_false_stall_and_delay_no_hang(tmp_path, db_uri):
    wall = SteppableWall()
    clock = SteppedServiceClock(wall)
    with InProcessService(tmp_path, db=db_uri, clock=clock, alert_webhooks=[]) as svc:
        c = svc.http
        assert c.put("/v1/runs/w", json={"world_size": 2}).status_code == 200
        step = 0
        for _ in range(10):                        # two healthy ranks, a push every 0.1 s
            _push(c, step, [0, 1])
            step += 1
            svc.advance(0.1, step_s=0.1)
        wall.offset_s += 90.0                      # the system clock jumps forward 90 s
        for _ in range(10):                        # 10 ticks while both ranks keep pushing
            _push(c, step, [0, 1])
            step += 1
            svc.advance(0.1, step_s=0.1)
        assert _absence_findings(c) == []          # wall time: a critical stall here

        wall.offset_s -= 3600.0                    # ... and back by an hour; rank 1 hangs now
        hung_at = clock.mono()
        found: list[dict] = []
        while clock.mono() - hung_at < HANG_FLOOR_S + 8.0 and not found:
            _push(c, step, [0])
            step += 1
            svc.advance(1.0)
            found = [f for f in _absence_findings(c) if f["kind"] == "hang" and f["status"] == "firing"]
        assert found, "the hang was not reported (wall time: an hour late)"
        assert found[0]["ranks"] == [1]
        assert HANG_FLOOR_S <= clock.mono() - hung_at < HANG_FLOOR_S + 8.0


def test_a_silence_lasts_its_duration_whatever_the_wall_clock_does(tmp_path):
    wall = SteppableWall()
    settings = Settings(db=str(tmp_path / "s.db"), alert_webhooks=[])
    app = create_app(settings, clock=ServiceClock(wall=wall))
    with TestClient(app) as c:
        r = c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "w"}], "duration_s": 600})
        assert r.status_code in (200, 201), r.text
        sid = r.json()["id"]

        def state() -> str:
            return next(s for s in c.get("/v1/silences").json()["silences"] if s["id"] == sid)["state"]

        assert state() == "active"
        wall.offset_s += 7200.0      # two hours forward: a wall-clock silence would have expired
        assert state() == "active"
        wall.offset_s -= 10800.0     # an hour back from the start: one would not have begun
        assert state() == "active"
