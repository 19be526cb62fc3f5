"""HangDetector driven by a simulated clock: exact firing times, culprits, stall, finish, resume."""
from __future__ import annotations

import json

import numpy as np
import pytest

from detectors.hang import HangDetector


class Cluster:
    """Ranks pushing one step every ``interval_s`` (seconds) on a fake clock, ticked every second."""

    def __init__(self, det: HangDetector, n_ranks: int = 8, interval_s: float = 1.0) -> None:
        self.det, self.n, self.interval_s = det, n_ranks, interval_s
        self.step = np.zeros(n_ranks, dtype=np.int64)
        self.alive = np.ones(n_ranks, dtype=bool)
        self.now = 0.0
        self.findings: list[tuple[float, object]] = []
        det.set_world(range(n_ranks), 0.0)

    def run_until(self, t_end: float, tick_every_s: float = 1.0) -> None:
        next_push = self.now
        while self.now < t_end:
            self.now = round(self.now + tick_every_s, 6)
            if self.now >= next_push + self.interval_s:
                next_push = self.now
                ranks = np.flatnonzero(self.alive)
                self.step[ranks] += 1
                for f in self.det.observe(ranks, self.step[ranks], self.now):
                    self.findings.append((self.now, f))
            for f in self.det.tick(self.now):
                self.findings.append((self.now, f))

    def summary(self):
        return [(t, f.kind, f.status, f.ranks, f.step) for t, f in self.findings]


def test_one_silent_rank_hangs_when_its_adaptive_timeout_passes_and_resolves_on_return():
    c = Cluster(HangDetector(timeout_floor_s=5.0, timeout_factor=10.0), interval_s=2.0)
    c.run_until(100.0)
    c.alive[3] = False                      # rank 3 last pushed at t=100 (step 50)
    c.run_until(200.0)
    c.alive[3] = True
    c.run_until(210.0)
    # Interval 2 s -> timeout max(5, 10 * 2) = 20 s: overdue after t=120; it is a hang (not the
    # start of a stall) once a peer progresses after that deadline: the push at t=122.
    assert c.summary() == [(122.0, "hang", "firing", (3,), 51), (202.0, "hang", "resolved", (3,), 51)]
    f = c.findings[0][1]
    assert f.severity == "critical" and f.evidence["timeout_s"] == pytest.approx(20.0)
    assert f.evidence["silent_s"] == pytest.approx(22.0) and f.evidence["culprit"] is False


def test_timeout_floor_applies_to_fast_pushers():
    c = Cluster(HangDetector(timeout_floor_s=30.0), interval_s=1.0)
    c.run_until(50.0)
    c.alive[0] = False
    c.run_until(100.0)
    assert c.summary() == [(81.0, "hang", "firing", (0,), 51)]   # 50 + 30 s floor, next tick


def test_all_ranks_silent_is_one_stall_not_n_hangs_and_it_resolves_when_any_rank_returns():
    c = Cluster(HangDetector(timeout_floor_s=5.0), n_ranks=64, interval_s=1.0)
    c.run_until(30.0)
    c.alive[:] = False
    c.run_until(100.0)
    c.alive[:] = True
    c.run_until(105.0)
    # Timeout max(5, 10 x 1 s) = 10 s after the last push at t=30.
    assert c.summary() == [(41.0, "stall", "firing", (), 31), (101.0, "stall", "resolved", (), 31)]
    assert c.findings[0][1].evidence["culprits"] == []


def test_a_finished_run_is_neither_hung_nor_stalled_until_data_arrives_again():
    det = HangDetector(timeout_floor_s=5.0)
    c = Cluster(det, interval_s=1.0)
    c.run_until(20.0)
    assert det.finish(20.5) == []
    c.alive[:] = False
    c.run_until(500.0)
    assert c.findings == []
    c.alive[:] = True                      # the run resumed after finish
    c.run_until(520.0)
    c.alive[:] = False
    c.run_until(600.0)
    assert [(k, s) for _, k, s, _, _ in c.summary()] == [("stall", "firing")]


def test_finish_resolves_an_open_hang():
    c = Cluster(HangDetector(timeout_floor_s=5.0), interval_s=1.0)
    c.run_until(20.0)
    c.alive[2] = False
    c.run_until(40.0)
    out = c.det.finish(40.0)
    assert [(f.kind, f.status, f.ranks) for f in out] == [("hang", "resolved", (2,))]


def test_a_rank_never_heard_from_waits_for_the_startup_timeout():
    det = HangDetector(timeout_floor_s=5.0, startup_timeout_s=60.0)
    c = Cluster(det, n_ranks=4, interval_s=1.0)
    c.alive[1] = False                     # never reports
    c.run_until(100.0)
    assert c.summary() == [(61.0, "hang", "firing", (1,), 0)]


def _stuck_job(det: HangDetector, n_ranks: int, culprit: int, culprit_phase: str | None,
               t_stop: float = 50.0, t_end: float = 200.0):
    """Every rank pushes a step per second until ``t_stop``; then the culprit gets stuck and the
    others block in the all-reduce. Heartbeats every 2 s carry each rank's phase (``None``: the
    culprit's heartbeats stop too, its process is dead). Returns findings as (t, finding)."""
    out = []
    det.set_world(range(n_ranks), 0.0)
    ranks = np.arange(n_ranks)
    t = 0.0
    while t < t_end:
        t += 1.0
        step = int(min(t, t_stop))
        if t <= t_stop:
            out += [(t, f) for f in det.observe(ranks, np.full(n_ranks, step), t)]
        if t % 2 == 0:
            for r in range(n_ranks):
                if t > t_stop and r == culprit:
                    if culprit_phase is None:
                        continue
                    phase = culprit_phase
                else:
                    phase = "collective" if t > t_stop else "compute"
                out += [(t, f) for f in det.heartbeat(r, step + 1, phase, t)]
        out += [(t, f) for f in det.tick(t)]
    return out


def test_heartbeats_name_the_rank_outside_the_collective_as_the_culprit():
    out = _stuck_job(HangDetector(timeout_floor_s=20.0), n_ranks=16, culprit=11, culprit_phase="data")
    assert [(t, f.kind, f.ranks, f.step) for t, f in out] == [
        (71.0, "stall", (), 51), (71.0, "hang", (11,), 51)]
    stall, hang = out[0][1], out[1][1]
    assert stall.evidence["culprits"] == [11]
    assert hang.evidence["culprit"] is True and hang.evidence["phase"] == "data"
    assert "15 ranks wait in 'collective'" in hang.evidence["reason"]
    assert "rank 11 is in 'data' at step 51" in hang.evidence["reason"]


def test_a_rank_whose_heartbeats_stop_while_peers_wait_is_the_culprit():
    det = HangDetector(timeout_floor_s=20.0, heartbeat_timeout_s=10.0)
    out = _stuck_job(det, n_ranks=16, culprit=4, culprit_phase=None)
    assert [(t, f.kind, f.ranks) for t, f in out] == [(71.0, "stall", ()), (71.0, "hang", (4,))]
    assert "no heartbeat" in out[1][1].evidence["reason"]


def test_everyone_inside_the_collective_blames_no_rank():
    out = _stuck_job(HangDetector(timeout_floor_s=20.0), n_ranks=8, culprit=0,
                     culprit_phase="collective")
    assert [(f.kind, f.ranks) for _, f in out] == [("stall", ())]
    assert "suspect the collective" in out[0][1].evidence["reason"]


def test_heartbeats_with_a_standing_step_do_not_keep_a_rank_alive():
    det = HangDetector(timeout_floor_s=10.0)
    c = Cluster(det, n_ranks=4, interval_s=1.0)
    c.run_until(20.0)
    c.alive[2] = False
    for t in range(21, 60):                 # rank 2's background thread keeps beating at step 21
        det.heartbeat(2, 21, "compute", float(t))
        c.run_until(float(t))
    hangs = [(t, f.ranks, f.evidence["phase"]) for t, f in c.findings if f.kind == "hang"]
    assert hangs == [(31.0, (2,), "compute")]


def test_heartbeats_without_a_step_prove_life_not_progress():
    det = HangDetector(timeout_floor_s=10.0)
    c = Cluster(det, n_ranks=4, interval_s=1.0)
    c.run_until(20.0)
    det.heartbeat(2, 21, "compute", 20.5)   # a known step, then the client stops telling it
    c.alive[2] = False
    for t in range(21, 60):
        det.heartbeat(2, -1, "compute", float(t))
        c.run_until(float(t))
    assert [(t, f.kind, f.ranks) for t, f in c.findings] == [(31.0, "hang", (2,))]


def test_ranks_that_leave_the_world_are_not_hung():
    det = HangDetector(timeout_floor_s=5.0)
    c = Cluster(det, n_ranks=8, interval_s=1.0)
    c.run_until(20.0)
    det.set_world(range(6), 20.0)          # scale down: ranks 6 and 7 leave
    c.alive[6:] = False
    c.run_until(100.0)
    assert c.findings == []


def test_state_round_trips_mid_silence_without_repeating_findings():
    def scenario(save_at: float | None):
        det = HangDetector(timeout_floor_s=5.0)
        c = Cluster(det, n_ranks=8, interval_s=1.0)
        c.run_until(30.0)
        c.alive[5] = False
        c.run_until(45.0)                   # hang already reported at t=41
        if save_at is not None:
            fresh = HangDetector(timeout_floor_s=5.0)
            fresh.load_state_dict(json.loads(json.dumps(det.state_dict())))
            c.det = fresh
        c.run_until(60.0)
        c.alive[5] = True
        c.run_until(70.0)
        return c.summary()
    assert scenario(None) == scenario(45.0) == [
        (41.0, "hang", "firing", (5,), 31), (61.0, "hang", "resolved", (5,), 31)]


def test_shift_clock_discounts_downtime_after_a_restart():
    def scenario(shift: bool):
        det = HangDetector(timeout_floor_s=5.0)
        c = Cluster(det, n_ranks=4, interval_s=1.0)
        c.run_until(30.0)
        saved = det.state_dict()
        fresh = HangDetector(timeout_floor_s=5.0)
        fresh.load_state_dict(saved)
        if shift:
            fresh.shift_clock(300.0)         # the service was down 300 s
        c.det, c.now = fresh, 330.0          # ranks' pushes during the downtime were lost
        return [f.kind for f in fresh.tick(330.5)]
    assert scenario(shift=False) == ["stall"]   # without it the downtime looks like silence
    assert scenario(shift=True) == []


def test_repeated_ranks_in_one_push_keep_the_newest_step_and_update_is_a_no_op():
    det = HangDetector(timeout_floor_s=5.0)
    det.observe(np.array([1, 0, 1, 0]), np.array([7, 3, 9, 4]), 1.0)
    assert det.state_dict()["last_step"] == [4, 9]
    from detectors.frame import StepBlock
    assert det.update(StepBlock.from_dense([0], [0], loss=[[1.0]])) == []


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="timeout_floor_s"):
        HangDetector(timeout_floor_s=0.0)


def test_when_a_stall_ends_the_ranks_that_waited_are_not_reported_hung():
    # The culprit comes back at t=100 and its records land first; its peers' records for the same
    # step land a second later, after a tick: they waited in the collective, they did not hang.
    det = HangDetector(timeout_floor_s=20.0)
    out = _stuck_job(det, n_ranks=8, culprit=3, culprit_phase="data", t_end=100.0)
    assert [f.kind for _, f in out if f.status == "firing"] == ["stall", "hang"]
    resolved = det.observe(np.array([3]), np.array([51]), 100.0)
    assert {(f.kind, f.status) for f in resolved} == {("stall", "resolved"), ("hang", "resolved")}
    assert det.tick(100.5) == []
    det.observe(np.array([0, 1, 2, 4, 5, 6, 7]), np.full(7, 51), 101.0)
    assert det.tick(101.5) == []
    # Silence still counts from the end of the stall: a peer that never resumes hangs later.
    for t in range(102, 140):
        det.observe(np.array([0, 1, 2, 3, 4, 5, 6]), np.full(7, 52 + t - 102), float(t))
        late = det.tick(float(t) + 0.5)
        if late:
            assert [(f.kind, f.ranks) for f in late] == [("hang", (7,))]
            break
    else:
        raise AssertionError("the rank that never resumed was not reported")
