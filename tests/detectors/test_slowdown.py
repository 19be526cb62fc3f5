"""SlowdownDetector on seeded traces: exact firing steps, onset, robustness to slow steps, and the
trainer-clock policy (with ``ts``: recorded at once as ``info``, a page only once it lasts)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.frame import StepBlock
from simulation import Straggler, simulate_run
from healthsvc_detectors.slowdown import SlowdownDetector


def _shifted(seed: int, factor: float, at: int, n_steps: int = 3000, n_ranks: int = 64,
             until: int | None = None) -> StepBlock:
    run = simulate_run(n_steps=n_steps, n_ranks=n_ranks, seed=seed)
    run.block.values["step_time"][at:until] *= factor
    return run.block


@pytest.mark.parametrize("factor, step, severity", [
    (1.1, 2109, "warning"),
    (1.25, 2106, "warning"),
    (2.0, 2106, "critical"),
])
def test_whole_job_shift_fires_at_pinned_step_with_onset_and_ratio(factor, step, severity):
    out = SlowdownDetector().update(_shifted(seed=1, factor=factor, at=2100))
    assert [(f.kind, f.step, f.ranks, f.onset_step, f.severity, f.metric) for f in out] == [
        ("slowdown", step, (), 2100, severity, "step_time")]
    assert out[0].evidence["ratio"] == pytest.approx(factor, rel=0.03)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clean_runs_with_periodic_slow_steps_raise_nothing(seed):
    # 10k steps with a 5x slower step (checkpoint/GC) every 500 steps, and warm-up.
    assert SlowdownDetector().update(simulate_run(n_steps=10_000, n_ranks=64, seed=seed).block) == []


def test_a_shift_smaller_than_min_ratio_is_not_reported():
    assert SlowdownDetector().update(_shifted(seed=2, factor=1.05, at=1500)) == []
    out = SlowdownDetector(min_ratio=1.03, resolve_ratio=1.015).update(_shifted(seed=2, factor=1.05, at=1500))
    # A shift this small is close to the noise: the CUSUM run (the onset estimate) had already
    # begun a little before it.
    assert [(f.step, f.onset_step) for f in out] == [(1508, 1474)]


def test_recovery_resolves():
    out = SlowdownDetector().update(_shifted(seed=3, factor=1.3, at=1200, until=1700))
    assert [(f.step, f.status) for f in out] == [(1206, "firing"), (1710, "resolved")]


def test_warm_up_slowness_is_not_a_baseline():
    block = _shifted(seed=4, factor=1.0, at=0)
    block.values["step_time"][:40] *= 8.0            # compilation: the first steps are slow
    assert SlowdownDetector().update(block) == []


def test_a_straggler_slows_the_whole_synchronous_job():
    run = simulate_run(n_steps=2000, n_ranks=32, seed=5, faults=[Straggler(step=1000, rank=3, factor=1.5)])
    out = SlowdownDetector().update(run.block)
    assert [(f.step, f.onset_step) for f in out] == [(1005, 996)]


def test_missing_ranks_and_missing_steps_are_skipped_not_zero():
    block = _shifted(seed=6, factor=1.25, at=1500)
    ref = SlowdownDetector().update(block)
    rng = np.random.default_rng(0)
    holes = rng.random(block.present["step_time"].shape) < 0.3
    block.present["step_time"][holes] = False
    block.values["step_time"][holes] = np.nan          # filler; must be ignored
    block.present["step_time"][700:710] = False          # ten frames nobody reported
    out = SlowdownDetector().update(block)
    assert [(f.step, f.onset_step) for f in out] == [(f.step, f.onset_step) for f in ref]


def test_state_round_trips_through_json_mid_shift():
    block = _shifted(seed=7, factor=1.3, at=900, n_steps=1500)
    ref = SlowdownDetector().update(block)
    det = SlowdownDetector()
    first = det.update(block.slice_steps(0, 903))
    fresh = SlowdownDetector()
    fresh.load_state_dict(json.loads(json.dumps(det.state_dict())))
    assert first + fresh.update(block.slice_steps(903, 1500)) == ref and len(ref) == 1


def test_blocks_without_step_time_are_ignored_and_thresholds_validated():
    assert SlowdownDetector().update(StepBlock.from_dense([0, 1], [0, 1], loss=np.ones((2, 2)))) == []
    with pytest.raises(ValueError, match="resolve_ratio"):
        SlowdownDetector(min_ratio=1.05, resolve_ratio=1.1)


# ------------------------------------------------------------- it must last to page (new)
def _with_ts(block: StepBlock, dt: float = 0.5, t0: float = 1_000.0) -> StepBlock:
    """The trainer's clock: ``ts`` = t0 + dt x step on every rank."""
    ts = t0 + dt * block.steps.astype(np.float64)
    block.values["ts"] = np.repeat(ts[:, None], block.n_ranks, axis=1)
    block.present["ts"] = np.ones(block.values["ts"].shape, dtype=bool)
    return block


@pytest.mark.parametrize("factor, dt, page_step, severity", [
    (1.25, 0.5, 2705, "warning"),   # slow since ~2105: 300 s = 600 steps of 0.5 s later
    (1.25, 2.0, 2255, "warning"),   # the same shift at 2 s per step: 150 steps later
    (2.0, 0.5, 2701, "critical"),
    (1.1, 0.5, 2720, "warning"),    # the slow level first passes 1.1x a little later
])
def test_with_the_trainer_clock_the_first_finding_is_info_and_the_page_comes_after_min_duration_s(
        factor, dt, page_step, severity):
    block = _with_ts(_shifted(seed=1, factor=factor, at=2100), dt)
    out = SlowdownDetector().update(block)
    fired = 2109 if factor == 1.1 else 2106       # the same steps as without ts
    assert [(f.step, f.onset_step, f.severity, f.status) for f in out] == [
        (fired, 2100, "info", "firing"), (page_step, 2100, severity, "firing")]
    assert out[1].evidence["slow_for_s"] == pytest.approx(300.0) and out[1].evidence["min_duration_s"] == 300.0
    assert out[1].evidence["ratio"] == pytest.approx(factor, rel=0.03)
    # Without ts the first finding already carries the severity (the simulator's case).
    plain = SlowdownDetector().update(_shifted(seed=1, factor=factor, at=2100))
    assert [(f.step, f.severity) for f in plain] == [(fired, severity)]


def test_a_slowdown_shorter_than_min_duration_s_never_pages():
    # 1.25x for 400 steps = 200 s of trainer time: recorded as info, never a warning; the
    # episode closes with "ended before min_duration_s".
    block = _with_ts(_shifted(seed=1, factor=1.25, at=2100, until=2500, n_steps=5000))
    out = SlowdownDetector().update(block)
    assert [(f.step, f.severity, f.status) for f in out][0] == (2106, "info", "firing")
    assert all(f.severity == "info" for f in out)
    assert [f.evidence.get("reason") for f in out if f.status == "resolved"] == ["ended before min_duration_s"]
    # With min_duration_s=150 the same shift lasts long enough to page.
    assert "warning" in [f.severity for f in SlowdownDetector(min_duration_s=150.0).update(block)]


def test_a_short_slowdown_is_closed_soon_after_the_job_is_back_to_normal():
    block = _with_ts(_shifted(seed=1, factor=1.25, at=2100, until=2500, n_steps=5000))
    resolved = [f for f in SlowdownDetector().update(block) if f.status == "resolved"]
    assert resolved and resolved[0].step <= 2500 + 100


def test_the_trainer_clock_survives_a_state_round_trip_between_info_and_page():
    block = _with_ts(_shifted(seed=1, factor=1.25, at=2100))
    ref = SlowdownDetector().update(block)
    det = SlowdownDetector()
    first = det.update(block.slice_steps(0, 2400))            # after the info, before the page
    fresh = SlowdownDetector()
    fresh.load_state_dict(json.loads(json.dumps(det.state_dict())))
    assert first + fresh.update(block.slice_steps(2400, block.n_steps)) == ref
    assert [f.severity for f in first] == ["info"] and len(ref) == 2


def test_one_step_without_ts_does_not_bypass_the_wait():
    block = _with_ts(_shifted(seed=1, factor=1.25, at=2100))
    fired = SlowdownDetector().update(block)[0].step
    block.present["ts"][block.steps == fired] = False     # the firing step's records carry no ts
    assert [(f.step, f.severity) for f in SlowdownDetector().update(block)][0] == (fired, "info")
