"""The spike baseline's noise estimate does not collapse (issue: "noise estimates that do not
collapse"): learning the scale only from values judged normal shrinks it to its floor on a
heavy-tailed series, and then everything fires. The scale learns every value outside a spike,
clipped, instead."""
from __future__ import annotations

import numpy as np

from detectors.frame import StepBlock
from detectors.robust import RobustTrend
from detectors.spike import LossSpikeDetector


def heavy_tailed_loss(n: int, seed: int, dof: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    curve = np.log(2.0 + 6.0 / np.sqrt(1.0 + np.arange(n) / 100.0))
    return np.exp(curve + 0.02 * rng.standard_t(dof, n))   # Student t: real curves' tails


def test_the_learned_scale_tracks_the_noise_on_a_heavy_tailed_series():
    y = np.log(heavy_tailed_loss(20_000, seed=1))
    trend = RobustTrend(warmup_steps=50, scale_alpha=0.02)
    sds = []
    for i, v in enumerate(y):
        if trend.warm and trend.zscore(v) > 6.0:
            trend.learn_scale(v)            # judged anomalous: only its (clipped) size is learned
        else:
            trend.learn(v)
        if i > 1_000:
            sds.append(trend.sd())
    # t(3) with scale 0.02 has a mean absolute deviation of ~0.022, i.e. a normal-equivalent sd
    # of ~0.028: the estimate stays there and far above the 0.005 floor all along.
    assert 0.015 < min(sds) and max(sds) < 0.05


def test_a_heavy_tailed_clean_curve_does_not_page():
    # 5 dof: tails well beyond a normal's (6-sigma values every few thousand steps), but no step
    # that doubles the loss, which would rightly be a warning.
    loss = heavy_tailed_loss(20_000, seed=2, dof=5.0)
    block = StepBlock.from_dense(np.arange(20_000), np.arange(1), loss=loss[:, None])
    found = LossSpikeDetector().update(block)
    assert not [f for f in found if f.severity != "info"]
    # and the occasional 6-sigma tail value is recorded, not a storm of findings
    assert len([f for f in found if f.status == "firing"]) < 20
