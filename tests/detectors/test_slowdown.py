"""SlowdownDetector on seeded traces: exact firing steps, onset, robustness to slow steps."""
from __future__ import annotations

import json

import numpy as np
import pytest

from detectors.frame import StepBlock
from detectors.simulate import Straggler, simulate_run
from detectors.slowdown import SlowdownDetector


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
