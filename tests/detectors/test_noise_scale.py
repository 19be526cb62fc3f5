"""The spike baseline's noise estimate does not collapse (issue: "noise estimates that do not
collapse"): learning the scale only from values judged normal shrinks it to its floor on a
heavy-tailed series, and then everything fires. The scale learns every value outside a spike,
clipped, instead."""
from __future__ import annotations

import numpy as np

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.stats.trend import RobustTrend
from healthsvc_detectors.spike import LossSpikeDetector


def heavy_tailed_loss(n: int, seed: int, dof: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    curve = np.log(2.0 + 6.0 / np.sqrt(1.0 + np.arange(n) / 100.0))
    return np.exp(curve + 0.02 * rng.standard_t(dof, n))   # Student t: real curves' tails


def test_the_scale_recovers_when_a_quiet_series_becomes_noisy():
    # A quiet stretch (the scale settles near its floor), then ordinary noise of 8 %: most values
    # now exceed 6 quiet sds and 10 %. Learning the scale only from values judged normal would keep
    # it at the floor and fire on every other step for ever; learning every value (clipped) lets it
    # catch up within tens of steps.
    rng = np.random.default_rng(3)
    n = 4_000
    noise = np.where(np.arange(n) < 2_000, 0.001, 0.08) * rng.standard_normal(n)
    loss = np.exp(np.log(3.0) + noise)
    found = LossSpikeDetector().update(StepBlock.from_dense(np.arange(n), np.arange(1), loss=loss[:, None]))
    late = [f for f in found if f.status == "firing" and f.step >= 2_200]
    assert late == [], late[:3]
    det = LossSpikeDetector()
    det.update(StepBlock.from_dense(np.arange(n), np.arange(1), loss=loss[:, None]))
    assert 0.06 < det._trend.sd() < 0.12


def test_learn_scale_moves_only_the_scale():
    t = RobustTrend(warmup_steps=5)
    for v in (1.0, 1.01, 0.99, 1.0, 1.01, 1.0):
        t.learn(v)
    level, trend, sd = t.level, t.trend, t.sd()
    t.learn_scale(5.0)                       # a wild value: clipped at clip sds
    assert (t.level, t.trend) == (level, trend)
    assert sd < t.sd() <= sd * (1 + t.scale_alpha * (t.clip * 1.2534 - 1)) + 1e-12


def test_a_heavy_tailed_clean_curve_does_not_page():
    # 5 dof: tails well beyond a normal's (6-sigma values every few thousand steps), but no step
    # that doubles the loss, which would rightly be a warning.
    loss = heavy_tailed_loss(20_000, seed=2, dof=5.0)
    block = StepBlock.from_dense(np.arange(20_000), np.arange(1), loss=loss[:, None])
    found = LossSpikeDetector().update(block)
    assert not [f for f in found if f.severity != "info"]
    # and the occasional 6-sigma tail value is recorded, not a storm of findings
    assert len([f for f in found if f.status == "firing"]) < 20
