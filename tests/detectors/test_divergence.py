"""DivergenceDetector: slow rise of the loss with an onset step; spikes and plateaus are not it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.divergence import DivergenceDetector
from simulation import Divergence, LossSpike, iter_blocks, simulate_run


def feed(det, block, size=32):
    return [f for b in iter_blocks(block, size) for f in det.update(b)]


def summary(findings):
    return [(f.step, f.severity, f.status, f.ranks, f.onset_step) for f in findings]


def trace(*faults, seed=5):
    return simulate_run(n_steps=4_000, n_ranks=64, seed=seed, faults=list(faults)).block


def test_slow_divergence_fires_then_escalates_with_an_onset():
    found = feed(DivergenceDetector(), trace(Divergence(step=2_500, rate=2e-4)))
    assert summary(found) == [(2_734, "warning", "firing", (), 2_571),
                              (3_322, "critical", "firing", (), 2_571)]
    assert found[0].evidence["rise"] == pytest.approx(0.02, abs=0.002)
    assert found[1].score == 1.0 and found[1].evidence["best_step"] == 2_571


def test_faster_divergence_is_caught_sooner_with_a_closer_onset():
    found = feed(DivergenceDetector(), trace(Divergence(step=2_500, rate=1e-3)))
    assert summary(found) == [(2_568, "warning", "firing", (), 2_503),
                              (2_715, "critical", "firing", (), 2_503)]


def test_recovery_resolves():
    block = trace(Divergence(step=2_500, rate=2e-4))
    rng = np.random.default_rng(0)
    block.values["loss"][2_800:] = block.values["loss"][2_499] * np.exp(rng.normal(0, 0.01, (1_200, 64)))
    assert summary(feed(DivergenceDetector(), block)) == [(2_734, "warning", "firing", (), 2_571),
                                                         (2_860, "info", "resolved", (), 2_571)]


def test_a_short_spike_is_not_a_divergence():
    assert feed(DivergenceDetector(), trace(LossSpike(step=2_500, factor=3.0, duration=3))) == []


def test_a_plateau_is_not_a_divergence():
    block = trace()
    rng = np.random.default_rng(1)
    block.values["loss"][2_000:] = block.values["loss"][2_000] * np.exp(rng.normal(0, 0.01, (2_000, 64)))
    assert feed(DivergenceDetector(), block) == []


def test_warm_up_is_not_judged():
    # The loss rising over the first 200 steps (e.g. an lr warm-up bump) is not a divergence.
    block = trace(Divergence(step=0, rate=1e-3))
    block.values["loss"][200:] = block.values["loss"][200]
    assert feed(DivergenceDetector(warmup_steps=250), block) == []


def test_state_round_trip_mid_divergence():
    block = trace(Divergence(step=2_500, rate=2e-4))
    whole = feed(DivergenceDetector(), block)
    first = DivergenceDetector()
    head = feed(first, block.slice_steps(0, 3_000))
    restored = DivergenceDetector()
    restored.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))
    assert head + feed(restored, block.slice_steps(3_000, 4_000)) == whole and len(whole) == 2
