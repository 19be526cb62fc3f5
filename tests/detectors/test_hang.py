"""HangDetector driven by a simulated clock: exact firing times, culprits, stall, finish, resume."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.hang import HangDetector


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


def test_heartbeats_name_the_rank_outside_the_collective_as_the_culprit_at_the_timeout():
    # The timeout path (the collective-wait path off): the stall and its culprit at the timeout.
    det = HangDetector(timeout_floor_s=20.0, collective_wait_s=None)
    out = _stuck_job(det, n_ranks=16, culprit=11, culprit_phase="data")
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
    # Its last heartbeat came with the last progress, not after it: it says nothing about the
    # silence, so the collective-wait path stays out and the timeout decides.
    assert [(t, f.kind, f.ranks) for t, f in out] == [(71.0, "stall", ()), (71.0, "hang", (4,))]
    assert "no heartbeat" in out[1][1].evidence["reason"]
    assert out[0][1].evidence["trigger"] == "timeout"


def test_everyone_inside_the_collective_blames_no_rank():
    out = _stuck_job(HangDetector(timeout_floor_s=20.0), n_ranks=8, culprit=0,
                     culprit_phase="collective")
    # No rank outside the collective: no culprit for the collective-wait path; the stall comes
    # from the timeout (20 s after the last progress at t=50, next tick).
    assert [(t, f.kind, f.ranks) for t, f in out] == [(71.0, "stall", ())]
    assert "suspect the collective" in out[0][1].evidence["reason"]
    assert out[0][1].evidence["trigger"] == "timeout"


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


def test_repeated_ranks_in_one_push_keep_the_newest_step_and_blocks_are_not_its_input():
    det = HangDetector(timeout_floor_s=5.0)
    det.observe(np.array([1, 0, 1, 0]), np.array([7, 3, 9, 4]), 1.0)
    assert det.state_dict()["last_step"] == [4, 9]
    # Blocks carry no arrival time: the hang detector is an absence detector, not a block one.
    from healthsvc_detectors.base import AbsenceDetector, BlockDetector
    assert isinstance(det, AbsenceDetector) and not isinstance(det, BlockDetector)


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


def _scripted(det: HangDetector, events) -> list[tuple[float, str, str, tuple, dict]]:
    """Drive ``det`` through (t, what, ...) events: ("push", ranks, step), ("beat", ranks, step,
    phase), ("tick",); returns (t, kind, status, ranks, evidence) of every finding."""
    out = []
    for t, what, *args in sorted(events, key=lambda e: e[0]):
        if what == "push":
            ranks = np.asarray(args[0], dtype=np.int64)
            found = det.observe(ranks, np.full(len(ranks), args[1]), t)
        elif what == "beat":
            found = [f for r in args[0] for f in det.heartbeat(r, args[1], args[2], t)]
        else:
            found = det.tick(t)
        out += [(t, f.kind, f.status, f.ranks, f.evidence) for f in found]
    return out


def _scripted_across(det: HangDetector, events, save_at: float | None, fresh) -> list:
    """:func:`_scripted`, through a snapshot taken at ``save_at`` (None: none) and loaded into
    ``fresh()``, as a restart or a takeover would."""
    if save_at is None:
        return _scripted(det, events)
    found = _scripted(det, [e for e in events if e[0] < save_at])
    again = fresh()
    again.load_state_dict(json.loads(json.dumps(det.state_dict())))
    return found + _scripted(again, [e for e in events if e[0] >= save_at])


def test_a_rank_hanging_before_a_checkpoint_pause_is_found_when_the_pause_ends():
    # Rank 3 last pushes at t=50 (step 50): 1 s interval, 30 s floor, so its deadline is t=80.
    # Ranks 0-2 push step 81 at t=81, after that deadline, and within the same second begin a
    # checkpoint: their heartbeats say "checkpoint" from t=81.5, so the tick at 81.9, the first to
    # see rank 3's hang, is held. The checkpoint ends at t=200 (step 82 pushed; at 200.5 the
    # heartbeats say "forward"). Ticks every second at .9.
    def job(det, save_at=None, drop=()):
        ev = [(float(t), "push", [0, 1, 2, 3] if t <= 50 else [0, 1, 2], t) for t in range(1, 82)]
        ev += [(t + 0.5, "beat", [0, 1, 2], 81, "checkpoint") for t in range(81, 200)]
        ev += [(float(t), "push", [0, 1, 2], t - 118) for t in range(200, 260)]
        ev += [(t + 0.5, "beat", [0, 1, 2], t - 118, "forward") for t in range(200, 260)]
        ev += [(t + 0.9, "tick") for t in range(1, 260)]
        if save_at is None:
            return _scripted(det, ev)
        found = _scripted(det, [e for e in ev if e[0] < save_at])
        state = json.loads(json.dumps(det.state_dict()))
        for key in drop:
            del state[key]
        fresh = HangDetector(timeout_floor_s=30.0)
        fresh.load_state_dict(state)
        return found + _scripted(fresh, [e for e in ev if e[0] >= save_at])

    found = job(HangDetector(timeout_floor_s=30.0))
    # Rank 3 keeps its silence through the pause: the first tick after it, 150.9 s after its last
    # progress, finds the hang (main restarted its clock at t=200 and found it at 230.9).
    assert [(t, k, s, r) for t, k, s, r, _ in found] == [(200.9, "hang", "firing", (3,))]
    ev = found[0][4]
    assert ev["silent_s"] == pytest.approx(150.9) and ev["timeout_s"] == pytest.approx(30.0)
    # The same from a snapshot taken in the pause, and from one of before "quiet_s" was kept.
    assert job(HangDetector(timeout_floor_s=30.0), save_at=150.0) == found
    assert job(HangDetector(timeout_floor_s=30.0), save_at=150.0, drop=("quiet_s",)) == found
    # The barrier: without a pause phase the same job has the hang at the tick the pause held
    # (then a stall, as ranks 0-2 fall silent for 119 s).
    no_pause = job(HangDetector(timeout_floor_s=30.0, pause_phases=()))
    assert [(t, k, s, r) for t, k, s, r, _ in no_pause][:2] == [
        (81.9, "hang", "firing", (3,)), (111.9, "stall", "firing", ())]


def test_a_rank_joining_during_a_checkpoint_pause_does_not_make_the_waiters_hang_after_it():
    # Every rank checkpoints from t=50.5 to 200; the world grows to 5 ranks at t=120 (the new
    # rank is known from then on, which tick counts as the job's latest progress). When the pause
    # ends, ranks 0 and 1 push first and ranks 2-4 0.6 s later, with a tick in between: ranks 2
    # and 3 waited in the pause (their deadlines passed during it, not before it began).
    det = HangDetector(timeout_floor_s=30.0)
    det.set_world(range(4), 0.0)
    ev = [(float(t), "push", [0, 1, 2, 3], t) for t in range(1, 51)]
    ev += [(t + 0.5, "beat", [0, 1, 2, 3], 50, "checkpoint") for t in range(50, 199)]
    ev += [(199.8, "beat", [0, 1, 2, 3], 50, "forward")]
    ev += [(float(t), "push", [0, 1], t - 149) for t in range(200, 210)]
    ev += [(t + 0.6, "push", [2, 3, 4], t - 149) for t in range(200, 210)]
    ev += [(t + 0.9, "tick") for t in range(1, 199)] + [(t + 0.3, "tick") for t in range(200, 210)]
    found = _scripted(det, [e for e in ev if e[0] < 120.2])
    det.set_world(range(5), 120.2)
    assert found + _scripted(det, [e for e in ev if e[0] >= 120.2]) == []


def test_a_rank_stuck_in_a_checkpoint_while_the_others_go_on_hangs_after_pause_timeout_s():
    # Rank 3 last pushes at t=50 (1 s interval, 30 s floor: deadline t=80), then its heartbeats
    # say "checkpoint" at step 51 every second, for good; ranks 0-2 go on pushing a step a second
    # (their heartbeats say "compute"). Nobody waits for rank 3, so its pause holds nothing: it
    # is excused while silent for less than pause_timeout_s (300 s), and the first tick after
    # t=350 finds it, silent since t=50 (main restarted its clock at every push after a held
    # tick, and found nothing, ever).
    def job(det, save_at=None, back_s=None):
        end = 400 if back_s is None else back_s
        ev = [(float(t), "push", [0, 1, 2, 3] if t <= 50 else [0, 1, 2], t) for t in range(1, 400)]
        ev += [(t + 0.5, "beat", [0, 1, 2], t + 1, "compute") for t in range(1, 400)]
        ev += [(t + 0.5, "beat", [3], 51, "checkpoint") for t in range(50, end)]
        if back_s is not None:   # the save ends: the heartbeat says so before the next record
            ev += [(back_s + 0.2, "beat", [3], 51, "forward")]
            ev += [(t + 0.6, "push", [3], t) for t in range(back_s, 400)]
            ev += [(t + 0.9, "beat", [3], t + 1, "compute") for t in range(back_s + 1, 400)]
        ev += [(t + 0.9, "tick") for t in range(1, 400)] + [(t + 0.3, "tick") for t in range(1, 400)]
        return _scripted_across(det, ev, save_at, lambda: HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0))

    found = job(HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0))
    assert [(t, k, s, r) for t, k, s, r, _ in found] == [(350.3, "hang", "firing", (3,))]
    ev = found[0][4]
    assert ev["silent_s"] == pytest.approx(300.3) and ev["timeout_s"] == pytest.approx(30.0)
    assert ev["phase"] == "checkpoint" and "a pause longer than pause_timeout_s" in ev["reason"]
    # The same through a snapshot taken in the pause.
    assert job(HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0), save_at=200.0) == found
    # A save that ends within pause_timeout_s is excused, also in the moment between the heartbeat
    # that leaves the checkpoint (150.2) and the rank's next record (150.6), with a tick (150.3).
    assert job(HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0), back_s=150) == []


def test_a_rank_whose_phase_flaps_between_a_checkpoint_and_work_at_a_standing_step_hangs():
    # Rank 3 last pushes at t=50 (1 s interval, 30 s floor); its heartbeats then say "checkpoint"
    # and "forward" by turns at step 51, for good (a save retried in a loop, a phase set on a
    # thread that is not stuck), while ranks 0-2 go on. Its first "forward" (51.5) brings it back
    # from the pause and restarts its silence; the later ones are no progress: it is found at the
    # first tick after the others progressed past its deadline (51.5 + 30 s) whose latest heartbeat
    # does not say "checkpoint": at 82.9 it says so (82.5), at 83.9 it does not. Main restarted
    # its silence at every "forward" and never found it.
    def job(det, save_at=None):
        ev = [(float(t), "push", [0, 1, 2, 3] if t <= 50 else [0, 1, 2], t) for t in range(1, 300)]
        ev += [(t + 0.5, "beat", [3], 51, "checkpoint" if t % 2 == 0 else "forward") for t in range(50, 300)]
        ev += [(t + 0.9, "tick") for t in range(1, 300)]
        return _scripted_across(det, ev, save_at, lambda: HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0))

    found = job(HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0))
    assert [(t, k, s, r) for t, k, s, r, _ in found] == [(83.9, "hang", "firing", (3,))]
    assert found[0][4]["silent_s"] == pytest.approx(32.4)
    assert job(HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0), save_at=60.0) == found
    # A snapshot from before the rule (no "back_step"): it loads, every rank may come back once.
    det = HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0)
    _scripted(det, [(float(t), "push", [0, 1], t) for t in range(1, 5)])
    old = {k: v for k, v in det.state_dict().items() if k != "back_step"}
    again = HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0)
    again.load_state_dict(old)
    assert again.state_dict()["back_step"] == [-2, -2]


def test_a_rank_that_checkpoints_again_at_a_later_step_comes_back_from_each_pause():
    # Rank 3 saves at steps 50 and 120 (60 s each; its heartbeats say "checkpoint" then, and
    # "forward" just before its next record), the others going on: both pauses are excused.
    ev = [(float(t), "push", [0, 1, 2], t) for t in range(1, 300)]
    ev += [(float(t), "push", [3], t) for t in range(1, 300) if not (50 < t <= 110 or 180 < t <= 240)]
    ev += [(t + 0.5, "beat", [3], step, "checkpoint") for step, start in ((50, 50), (180, 180))
           for t in range(start, start + 60)]
    ev += [(110.2, "beat", [3], 50, "forward"), (240.2, "beat", [3], 180, "forward")]
    ev += [(t + 0.9, "tick") for t in range(1, 300)] + [(t + 0.3, "tick") for t in range(1, 300)]
    assert _scripted(HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0), ev) == []


def test_a_rank_stuck_in_a_checkpoint_does_not_hide_another_rank_that_hangs_meanwhile():
    # As above (rank 3 "saving" since t=50), and rank 2 stops at t=100 with no heartbeat: ranks 0
    # and 1 go on without both. Rank 2 is found 30 s after its last push (main held every tick
    # for rank 3's pause and restarted rank 2's clock at each push: neither was ever found).
    ev = [(float(t), "push", [0, 1, 2, 3] if t <= 50 else [0, 1, 2] if t <= 100 else [0, 1], t)
          for t in range(1, 400)]
    ev += [(t + 0.5, "beat", [3], 51, "checkpoint") for t in range(50, 400)]
    ev += [(t + 0.9, "tick") for t in range(1, 400)]
    found = _scripted(HangDetector(timeout_floor_s=30.0, pause_timeout_s=300.0), ev)
    assert [(t, k, s, r) for t, k, s, r, _ in found] == [
        (131.9, "hang", "firing", (2,)), (350.9, "hang", "firing", (3,))]
    assert found[0][4]["silent_s"] == pytest.approx(31.9)
    assert found[1][4]["silent_s"] == pytest.approx(300.9)


def test_a_checkpoint_of_the_whole_job_is_no_hang_when_the_heartbeats_resume_before_the_records():
    # Every rank checkpoints from t=50.5 (heartbeats every second); rank 4 joins the world at
    # t=120.2 (the new rank counts as the job's latest progress) and sends nothing. At 199.8 the
    # heartbeats of ranks 0-3 leave the checkpoint, a tick falls at 199.9, the records come at 200
    # (ranks 0 and 1) and 200.6 (ranks 2-4), a tick in between. The ranks came back from the
    # pause that held the job: the job resumes with them (main found ranks 0-3 hung at 199.9).
    def job(det, world=range(5), others="checkpoint"):
        det.set_world(range(4), 0.0)
        ev = [(float(t), "push", [0, 1, 2, 3], t) for t in range(1, 51)]
        ev += [(t + 0.5, "beat", [0], 50, "checkpoint") for t in range(50, 199)]
        ev += [(t + 0.5, "beat", [1, 2, 3], 50, others) for t in range(50, 199)]
        ev += [(199.8, "beat", [0, 1, 2, 3], 50, "forward")]
        ev += [(float(t), "push", [0, 1], t - 149) for t in range(200, 240)]
        ev += [(t + 0.6, "push", [2, 3, 4], t - 149) for t in range(200, 240)]
        ev += [(t + 0.9, "tick") for t in range(1, 240)] + [(t + 0.3, "tick") for t in range(200, 240)]
        found = _scripted(det, [e for e in ev if e[0] < 120.2])
        det.set_world(world, 120.2)
        return found + _scripted(det, [e for e in ev if e[0] >= 120.2])

    assert job(HangDetector(timeout_floor_s=30.0)) == []
    assert job(HangDetector(timeout_floor_s=30.0), world=range(4)) == []
    # Rank 0 saving while ranks 1-3 wait for it in a barrier: the same.
    assert job(HangDetector(timeout_floor_s=30.0), others="collective") == []
    # The barrier for those "nothing": without a pause phase the checkpoint is a stall.
    assert [(t, k) for t, k, *_ in job(HangDetector(timeout_floor_s=30.0, pause_phases=()))][:1] == [
        (80.9, "stall")]


def test_a_stall_first_seen_late_names_the_rank_that_hung_before_it_when_the_job_resumes():
    # Rank 3 last pushes at t=50 (deadline t=80); ranks 0-2 go on to t=85, then every rank is
    # silent. No tick falls between t=79.9 and 120.9 (the caller was busy), so the first tick sees
    # every rank overdue: a stall, with no culprit named. Ranks 0-2 resume at t=150; rank 3 was
    # silent past its deadline while they progressed, so it did not wait in the stall: the next
    # tick names it (main restarted its clock at t=150 and named it at 181.9).
    ev = [(float(t), "push", [0, 1, 2, 3] if t <= 50 else [0, 1, 2], t) for t in range(1, 86)]
    ev += [(float(t), "push", [0, 1, 2], t - 64) for t in range(150, 200)]
    ev += [(t + 0.9, "tick") for t in [*range(1, 80), *range(120, 200)]]
    found = _scripted(HangDetector(timeout_floor_s=30.0), ev)
    assert [(t, k, s, r) for t, k, s, r, _ in found] == [
        (120.9, "stall", "firing", ()), (150.0, "stall", "resolved", ()),
        (150.9, "hang", "firing", (3,))]
    assert found[2][4]["silent_s"] == pytest.approx(100.9)


def test_a_rank_already_hung_keeps_its_silence_when_a_stall_ends():
    # Rank 3 pushes every 5 s (timeout 50 s), ranks 0-2 every second (the 30 s floor). Rank 3
    # last pushes at t=60 and hangs (found at 111.9); ranks 0-2 stop after t=120 (a stall at
    # 150.9), resume at t=200 and stop again after t=210.
    ev = [(float(t), "push", [0, 1, 2, 3] if t % 5 == 0 and t <= 60 else [0, 1, 2], t)
          for t in [*range(1, 121), *range(200, 211)]]
    ev += [(t + 0.9, "tick") for t in range(1, 300)]
    det = HangDetector(timeout_floor_s=30.0)
    found = _scripted(det, [e for e in ev if e[0] < 201])
    assert [(t, k, s, r) for t, k, s, r, _ in found] == [
        (111.9, "hang", "firing", (3,)), (150.9, "stall", "firing", ()),
        (200.0, "stall", "resolved", ())]
    # The stall's end restarts the clocks of the ranks that waited in it, not rank 3's: it still
    # has been silent since t=60, and its hang stays open (not resolved, not raised again).
    assert det.state_dict()["progress_s"] == [200.0, 200.0, 200.0, 60.0]
    later = _scripted(det, [e for e in ev if e[0] >= 201])
    # The next stall comes when ranks 0-2 are 30 s overdue (main waited for rank 3's restarted
    # 50 s timeout: 250.9).
    assert [(t, k, s, r) for t, k, s, r, _ in later] == [(240.9, "stall", "firing", ())]


# ------------------------------------------------------------------ the collective-wait path
class SyncJob:
    """A synchronous data-parallel job on a fake clock (integer milliseconds, so it is exact).

    Step k (1-based) runs from ``(k-1) * step_s``: rank r computes until ``compute_s + late[r]``
    into the step, then waits in the collective until the step ends. Records of the finished
    steps are pushed every ``push_s`` seconds (one push, every rank); each rank sends a heartbeat
    every ``hb_s`` seconds (ranks staggered) with the step it is in and its phase; the detector
    ticks every second. ``hang_step``: ``culprit`` stops computing in that step and everyone
    else waits in its collective for good. ``pause``: (start_s, end_s, phase_of_rank) — every
    rank stops at ``start_s`` (between steps) and sends that phase until ``end_s``.
    """

    def __init__(self, det: HangDetector, *, n_ranks=8, step_s=0.5, compute_s=0.4, late=None,
                 push_s=1.0, hb_s=1.0, hang_step=None, culprit=None, pause=None):
        self.det, self.n = det, n_ranks
        self.step_ms, self.compute_ms = round(step_s * 1000), round(compute_s * 1000)
        self.late_ms = [round((late or {}).get(r, 0.0) * 1000) for r in range(n_ranks)]
        self.push_ms, self.hb_ms = round(push_s * 1000), round(hb_s * 1000)
        self.hang_step, self.culprit, self.pause = hang_step, culprit, pause
        self.pushed = 0              # steps pushed so far
        self.last_push_s = None      # when records last arrived
        self.split_s = 0.0           # longest time the heartbeats showed peers waiting on a rank
        self._split_since = None
        self.findings: list[tuple[float, object]] = []
        det.set_world(range(n_ranks), 0.0)

    def _paused_ms(self, ms):
        """Milliseconds of pause before ``ms`` (the job's own clock stands still meanwhile)."""
        if self.pause is None:
            return 0
        start, end = round(self.pause[0] * 1000), round(self.pause[1] * 1000)
        return 0 if ms < start else min(ms, end) - start

    def state(self, r, ms):
        """(step, phase) of rank r at time ms."""
        if self.pause is not None and self.pause[0] * 1000 <= ms < self.pause[1] * 1000:
            return self.done(round(self.pause[0] * 1000)), self.pause[2](r)
        job_ms = ms - self._paused_ms(ms)
        step = job_ms // self.step_ms + 1
        if self.hang_step is not None and step >= self.hang_step:
            return self.hang_step, "compute" if r == self.culprit else "collective"
        into = job_ms % self.step_ms
        return step, "compute" if into < self.compute_ms + self.late_ms[r] else "collective"

    def done(self, ms):
        """Steps every rank has finished by time ms."""
        job_ms = ms - self._paused_ms(ms)
        step = job_ms // self.step_ms
        return step if self.hang_step is None else min(step, self.hang_step - 1)

    def run_until(self, t_end_s):
        ms = getattr(self, "_ms", 0)
        while ms < round(t_end_s * 1000):
            ms += 100
            now = ms / 1000
            if ms % self.push_ms == 0 and self.done(ms) > self.pushed:
                steps = np.arange(self.pushed + 1, self.done(ms) + 1)
                ranks = np.tile(np.arange(self.n), len(steps))
                self._emit(now, self.det.observe(ranks, np.repeat(steps, self.n), now))
                self.pushed, self.last_push_s = int(steps[-1]), now
            beats = []
            for r in range(self.n):
                if (ms - 100 * r) % self.hb_ms == 0:   # staggered by 0.1 s per rank
                    beats.append(self.state(r, ms))
                    self._emit(now, self.det.heartbeat(r, *beats[-1], now))
            self._watch_split(now)
            if ms % 1000 == 0:
                self._emit(now, self.det.tick(now))
        self._ms = ms

    def _watch_split(self, now):
        """How long the job really was split (some ranks in the collective, some computing)."""
        phases = {self.state(r, round(now * 1000))[1] for r in range(self.n)}
        if phases == {"compute", "collective"}:
            self._split_since = now if self._split_since is None else self._split_since
            self.split_s = max(self.split_s, now - self._split_since)
        else:
            self._split_since = None

    def _emit(self, now, found):
        self.findings += [(now, f) for f in found]

    def summary(self):
        return [(t, f.kind, f.status, f.ranks) for t, f in self.findings]


@pytest.mark.parametrize("hb_s,push_s", [(1.0, 1.0), (5.0, 1.0), (5.0, 5.0)])
def test_a_rank_stuck_outside_the_collective_is_named_within_20_s_of_the_last_progress(hb_s, push_s):
    # Defaults only. 0.5 s steps; rank 5 stops computing in step 120 (t=59.5) while its 7 peers
    # wait in the all-reduce. The timeouts alone would take 60 s; the collective-wait path names
    # rank 5 once the job has been quiet for collective_wait_s (10 s).
    job = SyncJob(HangDetector(), hb_s=hb_s, push_s=push_s, hang_step=120, culprit=5)
    job.run_until(100.0)
    firing = [(t, f) for t, f in job.findings if f.status == "firing"]
    assert [(f.kind, f.ranks) for _, f in firing] == [("stall", ()), ("hang", (5,))]
    t_found = firing[0][0]
    assert job.last_push_s is not None and 10.0 <= t_found - job.last_push_s <= 20.0
    stall, hang = firing[0][1], firing[1][1]
    assert stall.evidence["culprits"] == [5] and stall.evidence["trigger"] == "collective_wait"
    assert stall.step == hang.step == 120 and hang.severity == "critical"
    assert hang.evidence["culprit"] is True and hang.evidence["phase"] == "compute"
    assert hang.evidence["reason"].startswith("peers waiting in the collective at step 120 (7 ranks")
    assert "rank 5 in phase 'compute' at step 120" in hang.evidence["reason"]
    # Nothing more while it stays stuck: the timeout's stall is the same stall, already open.
    job.run_until(200.0)
    assert len([f for _, f in job.findings if f.status == "firing"]) == 2


def test_the_culprit_resumes_and_the_findings_resolve():
    det = HangDetector()
    job = SyncJob(det, hang_step=60, culprit=2)
    job.run_until(50.0)
    assert [(k, r) for _, k, s, r in job.summary() if s == "firing"] == [("stall", ()), ("hang", (2,))]
    out = det.observe(np.arange(8), np.full(8, 60), 50.5)
    assert {(f.kind, f.status) for f in out} == {("stall", "resolved"), ("hang", "resolved")}


def test_clean_run_with_three_minute_steps_and_a_late_rank_raises_nothing():
    # 3-minute steps; rank 6 reaches the all-reduce 40 s after its peers every step (an uneven
    # shard), so the heartbeats show the hang's split for 40 s of every step. Quiet for 40 s is
    # normal when a step takes 180 s: the bound is collective_wait_steps (3) x the step time.
    def job(det):
        j = SyncJob(det, step_s=180.0, compute_s=130.0, late={6: 40.0}, push_s=1.0, hb_s=5.0)
        j.run_until(180.0 * 20)
        return j
    clean = job(HangDetector())
    assert clean.split_s >= 39.0 and clean.findings == []
    # The barrier for that "nothing": without the relative bound the same heartbeats do fire.
    floor_only = job(HangDetector(collective_wait_steps=0.0))
    assert ("hang", (6,)) in [(k, r) for _, k, s, r in floor_only.summary() if s == "firing"]


def test_a_checkpoint_pausing_every_rank_for_two_minutes_raises_nothing():
    def job(det, phase_of_rank):
        j = SyncJob(det, pause=(100.0, 220.0, phase_of_rank))
        j.run_until(300.0)
        return j
    everyone = job(HangDetector(), lambda r: "checkpoint")
    assert everyone.pushed == 360 and everyone.findings == []   # it resumed: 200 + 160 steps
    # Rank 0 writes the checkpoint while the others wait for it in a barrier: normal too.
    rank0 = job(HangDetector(), lambda r: "checkpoint" if r == 0 else "collective")
    assert rank0.findings == []
    # The barrier for that "nothing": with no pause phase the 120 s pause is a stall (60 s floor).
    no_pause = job(HangDetector(pause_phases=()), lambda r: "checkpoint")
    assert [(k, s) for _, k, s, _ in no_pause.summary()][:1] == [("stall", "firing")]


def test_a_checkpoint_that_never_ends_is_a_stall_after_pause_timeout_s():
    job = SyncJob(HangDetector(pause_timeout_s=300.0), pause=(100.0, 1e9, lambda r: "checkpoint"))
    job.run_until(500.0)
    firing = [(t, k, r) for t, k, s, r in job.summary() if s == "firing"]
    # The last heartbeats to move (to step 200) came at t=100.0..100.7, one rank every 0.1 s:
    # the last of them is excused until t=400.7; the next tick reports the stall.
    assert firing == [(401.0, "stall", ())]


def test_everyone_waiting_in_the_collective_is_left_to_the_timeout_stall():
    job = SyncJob(HangDetector(), hang_step=120, culprit=None)   # no rank stays outside
    job.run_until(150.0)
    firing = [(t, f) for t, f in job.findings if f.status == "firing"]
    assert [(f.kind, f.ranks) for _, f in firing] == [("stall", ())]
    assert firing[0][1].evidence["trigger"] == "timeout"
    assert firing[0][0] - job.last_push_s >= 60.0   # the 60 s floor, not the fast path
    assert "suspect the collective" in firing[0][1].evidence["reason"]


@pytest.mark.parametrize("case", ["no step", "culprit ahead", "absent heartbeat", "dead culprit",
                                  "majority out"])
def test_heartbeats_that_do_not_show_the_split_leave_it_to_the_timeouts(case):
    det = HangDetector()
    ranks = np.arange(4)
    for t in range(1, 51):                       # 1 s steps, then every rank falls silent
        det.observe(ranks, np.full(4, t), float(t))
    for t in range(51, 100):
        for r in range(4):
            step, phase = 51, "collective" if r else "compute"
            if case == "no step":
                step = -1
            elif case == "culprit ahead" and r == 0:
                step = 52
            elif case == "absent heartbeat" and r == 3:
                continue                         # rank 3 says nothing about the silence
            elif case == "dead culprit" and r == 0 and t > 54:
                continue                         # rank 0's process died 4 s into the silence
            elif case == "majority out" and r in (1, 2):
                phase = "data"
            det.heartbeat(r, step, phase, t + 0.1 * r)
        for f in det.tick(t + 0.5):
            assert t + 0.5 >= 110.0, (case, t, f)   # only the timeout (60 s after t=50)
            assert f.evidence["trigger"] == "timeout"


def test_collective_wait_state_round_trips_and_old_snapshots_load():
    def scenario(save_at):
        det = HangDetector()
        job = SyncJob(det, hang_step=60, culprit=3)
        job.run_until(save_at)
        fresh = HangDetector()
        fresh.load_state_dict(json.loads(json.dumps(det.state_dict())))
        job.det = fresh
        job.run_until(80.0)
        return job.summary()
    assert scenario(31.0) == scenario(35.0) == scenario(79.0)
    assert [k for _, k, s, _ in scenario(35.0) if s == "firing"] == ["stall", "hang"]
    det = HangDetector()
    det.observe(np.arange(2), np.ones(2, dtype=np.int64), 1.0)
    old = det.state_dict()
    for key in ("front_step", "front_s", "step_samples"):
        del old[key]
    HangDetector().load_state_dict(old)          # a snapshot from before the fast path


def test_bad_collective_wait_parameters_are_refused():
    with pytest.raises(ValueError, match="collective_wait_s"):
        HangDetector(collective_wait_s=0.0)
    with pytest.raises(ValueError, match="pause_timeout_s"):
        HangDetector(pause_timeout_s=-1.0)
