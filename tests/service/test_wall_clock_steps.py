"""Monotonic time (issue 12, finding 8): steps of the wall clock move no timeout. The service runs
in-process with a wall clock the test steps (the real system clock is left alone)."""
from __future__ import annotations

import time

from starlette.testclient import TestClient

from healthsvc.app import create_app
from healthsvc.clock import ServiceClock
from healthsvc.settings import Settings


class SteppableWall:
    """The system's wall clock plus an offset the test changes (a `date -s` without root)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


def _push(c: TestClient, step: int, ranks: list[int]) -> None:
    body = {"columns": {"step": [step] * len(ranks), "rank": ranks, "loss": [1.0] * len(ranks)}}
    assert c.post("/v1/runs/w/metrics", json=body).status_code == 202


def _absence_findings(c: TestClient) -> list[dict]:
    return [f for f in c.get("/v1/runs/w/findings").json() if f["kind"] in ("hang", "stall")]


def test_wall_clock_steps_raise_no_false_stall_and_delay_no_hang(tmp_path):
    wall = SteppableWall()
    settings = Settings(db=str(tmp_path / "c.db"), tick_interval_s=0.1, alert_webhooks=[])
    app = create_app(settings, clock=ServiceClock(wall=wall))
    with TestClient(app) as c:
        assert c.put("/v1/runs/w", json={"world_size": 2, "detectors": {"hang": {"timeout_floor_s": 1.5}}}).status_code == 200
        step = 0
        for _ in range(10):                        # two healthy ranks, a push every 0.1 s
            _push(c, step, [0, 1])
            step += 1
            time.sleep(0.1)
        wall.offset_s += 90.0                      # the system clock jumps forward 90 s
        until = time.monotonic() + 1.0
        while time.monotonic() < until:            # ~10 ticks while both ranks keep pushing
            _push(c, step, [0, 1])
            step += 1
            time.sleep(0.1)
        app.state.monitor.drain()                  # barrier: every tick so far has been judged
        assert _absence_findings(c) == []          # wall time: a critical stall here

        wall.offset_s -= 3600.0                    # ... and back by an hour; rank 1 hangs now
        hung_at = time.monotonic()
        found: list[dict] = []
        while time.monotonic() - hung_at < 8.0 and not found:
            _push(c, step, [0])
            step += 1
            time.sleep(0.1)
            found = [f for f in _absence_findings(c) if f["kind"] == "hang" and f["status"] == "firing"]
        assert found, "the hang was not reported (wall time: an hour late)"
        assert found[0]["ranks"] == [1]
        assert time.monotonic() - hung_at < 8.0


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
