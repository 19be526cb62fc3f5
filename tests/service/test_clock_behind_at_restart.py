"""A restart with the wall clock behind delays nothing (issue 25, finding 5): the service clock
starts from the newest time the store holds, so stored times (each rank's last push) compare
with it as they did before the restart. In-process, on the real :class:`ServiceClock` over a
wall clock the test sets back and a monotonic clock the test advances."""
from __future__ import annotations

import pytest

from tests.harness import InProcessService
from tests.service.test_wall_clock_steps import SteppableWall, SteppedServiceClock, _absence_findings, _push

pytestmark = pytest.mark.both_stores

FLOOR_S = 5.0           # the run's hang/stall timeout floor (pushes every 0.5 s: the floor decides)
STALL_WITHIN_S = 15.0   # the floor, and the ticks around it


def _stall_after(svc: InProcessService, clock: SteppedServiceClock, limit_s: float) -> float | None:
    """Seconds (service monotonic) until a firing stall is listed, or None within ``limit_s``."""
    started = clock.mono()
    while clock.mono() - started < limit_s:
        svc.advance(1.0)
        if any(f["kind"] == "stall" and f["status"] == "firing" for f in _absence_findings(svc.http)):
            return clock.mono() - started
    return None


@pytest.mark.parametrize("behind_s", [0.0, 60.0, 3600.0])
def test_a_restart_with_the_wall_clock_behind_delays_no_stall(tmp_path, db_uri, behind_s):
    wall = SteppableWall()
    clock = SteppedServiceClock(wall)
    with InProcessService(tmp_path, db=db_uri, clock=clock, alert_webhooks=[]) as svc:
        assert svc.http.put("/v1/runs/w", json={"world_size": 2, "detectors": {"hang": {"timeout_floor_s": FLOOR_S}}}).status_code == 200
        for step in range(20):
            _push(svc.http, step, [0, 1])
            svc.advance(0.5, step_s=0.5)
    # The service restarts on a machine whose clock is behind (NTP not synced yet); the job
    # died meanwhile: its silence is a stall, to be found within the stall timeout, not the offset.
    wall.offset_s -= behind_s
    clock = SteppedServiceClock(wall)
    with InProcessService(tmp_path, db=db_uri, clock=clock, alert_webhooks=[]) as svc:
        assert _absence_findings(svc.http) == []
        took = _stall_after(svc, clock, limit_s=STALL_WITHIN_S)
        assert took is not None, f"no stall within {STALL_WITHIN_S} s of a restart {behind_s} s behind"
