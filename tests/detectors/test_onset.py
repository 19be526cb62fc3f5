"""Onset estimation: pinned seeded traces, the loss/gradient lag, properties, and edge cases."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.offline.onset import (OnsetParams, estimate_onset, estimate_onset_from_block)
from simulation import CorruptRank, Divergence, GradSpike, NonFinite, simulate_run

METRICS = ("loss", "grad_norm", "local_grad_norm")


def run(faults=(), n_steps=6000, seed=0, n_ranks=16, **kw):
    return simulate_run(n_steps=n_steps, n_ranks=n_ranks, seed=seed, faults=list(faults),
                        metrics=METRICS, **kw).block


def curve(n=4000, seed=0, sigma=0.02):
    rng = np.random.default_rng(seed)
    steps = np.arange(1, n + 1)
    loss = 3.0 * steps ** -0.1 * np.exp(rng.normal(0, sigma, n))
    grad = np.exp(rng.normal(0, 0.1, n))
    return steps, loss, grad


# ---------------------------------------------------------------------- abrupt, pinned steps

def test_nan_gradient_gives_the_exact_update_step_and_blames_the_rank():
    est = estimate_onset_from_block(run([NonFinite(step=4321, rank=5)], n_steps=4400))
    assert (est.step, est.low, est.high) == (4321, 4321, 4321)
    assert est.signals_used[0] == "non_finite"
    assert est.per_signal["non_finite"].ranks == (5,)
    assert est.origin == "hardware" and est.ranks == (5,)


def test_nan_seen_first_in_the_loss_means_the_update_before_it():
    steps, loss, grad = curve()
    loss[3000:] = np.nan                   # step 3001 is the first NaN loss
    est = estimate_onset(steps, loss=loss, grad_norm=grad)
    assert (est.step, est.low, est.high) == (3000, 3000, 3001)


def test_grad_burst_on_every_rank_is_pinned_and_points_at_the_data():
    est = estimate_onset_from_block(run([GradSpike(step=5000, factor=10.0)], n_steps=5010))
    assert est.step == 5000 and est.low <= 5000 <= est.high
    assert est.origin == "data" and est.spike_end is not None and est.spike_end >= 5000


def test_a_change_seen_only_in_the_loss_is_dated_one_update_earlier():
    steps, loss, _ = curve()
    loss[steps >= 3500] *= 1.3             # first higher loss at step 3500
    est = estimate_onset(steps, loss=loss)
    assert est.step == 3499                # the update of step 3499 poisoned the weights
    assert est.low <= 3499 and est.high >= 3500  # a bad batch at 3500 stays possible


def test_silent_corruption_on_one_rank_is_pinned_and_blames_it():
    est = estimate_onset_from_block(
        run([CorruptRank(step=4800, rank=11, local_grad_scale=2.0)], n_steps=4850))
    assert est.step == 4800 and est.low <= 4800 <= est.high
    assert est.origin == "hardware" and est.ranks == (11,)
    assert "rank_disagreement" in est.signals_used



@pytest.mark.parametrize("seed, step", [(0, 602), (1, 600), (2, 603), (3, 603), (4, 600), (5, 600)])
def test_a_rank_whose_disagreement_steps_up_by_about_one_noise_sd_is_dated_by_it(seed, step):
    # Gradient noise on a quarter of one rank's elements (tests/quality/traces/
    # sdc_slow_noise_s12_r2): its local norm is 1.115x its peers' for good, about one per-step
    # noise sd (0.08 here). The rank stands out by its t-statistic; its change point is
    # significant by LR but fell under the aggregate series' min_excess_sigma of 1.5.
    block = simulate_run(n_steps=900, n_ranks=4, seed=seed, metrics=METRICS,
                         faults=[CorruptRank(step=600, rank=2, local_grad_scale=1.115)]).block
    sig = estimate_onset_from_block(block, finding_steps=[700]).per_signal["rank_disagreement"]
    assert (sig.step, sig.ranks, sig.shape) == (step, (2,), "abrupt")
    assert sig.low <= 600 <= sig.high and not sig.detail.get("located_after_finding")


# --------------------------------------------------------------------------------- gradual

def test_slow_drift_without_nan_is_bracketed():
    est = estimate_onset_from_block(run([Divergence(step=5000, rate=2e-4, grad_rate=1e-4)],
                                        n_steps=5400))
    assert est.low <= 5000 <= est.high
    assert est.shape == "gradual" and est.per_signal["loss_trend"].shape == "gradual"
    assert est.high - est.low < 300
    assert "non_finite" not in est.signals_used


# ------------------------------------------------------------------------------ no evidence

def test_a_clean_trace_has_no_onset():
    assert estimate_onset_from_block(run(n_steps=5000, seed=4)) is None


def test_constant_series_never_has_an_onset():
    steps = np.arange(1000)
    assert estimate_onset(steps, loss=np.full(1000, 2.5), grad_norm=np.ones(1000)) is None


def test_a_finding_the_history_does_not_confirm_gets_a_located_low_confidence_onset():
    steps, loss, grad = curve()
    est = estimate_onset(steps, loss=loss, grad_norm=grad, finding_steps=[3200, 3300])
    assert est.high <= 3200 and est.confidence <= 0.1
    assert all(sig.detail.get("located_after_finding")
               for name, sig in est.per_signal.items() if name != "findings")


def test_findings_alone_on_a_flat_history_give_the_finding_step():
    steps = np.arange(1000)
    est = estimate_onset(steps, loss=np.full(1000, 2.5), finding_steps=[800])
    assert est.signals_used == ["findings"] and (est.low, est.high) == (799, 800)


def test_a_finding_bounds_the_onset_from_above():
    steps, loss, grad = curve()
    grad[steps >= 3500] *= 8
    est = estimate_onset(steps, loss=loss, grad_norm=grad, finding_steps=[3400])
    assert est.high <= 3400 and est.low <= est.step <= est.high


# ------------------------------------------------------------------------------- properties

def test_missing_values_are_not_non_finite():
    block = run(n_steps=3000, seed=2, missing_fraction=0.05)
    assert np.isnan(block.values["loss"][~block.present["loss"]]).all()  # filler only
    est = estimate_onset_from_block(block)
    assert est is None or "non_finite" not in est.signals_used


def test_permuted_ranks_change_nothing():
    block = run([CorruptRank(step=4800, rank=3, local_grad_scale=1.5)], n_steps=4900, seed=5)
    order = np.random.default_rng(0).permutation(block.n_ranks)
    a = estimate_onset_from_block(block)
    b = estimate_onset_from_block(block.take_ranks(order))
    assert (a.step, a.low, a.high, a.ranks) == (b.step, b.low, b.high, b.ranks)


def test_per_rank_nan_is_data_not_missing():
    block = run(n_steps=3000, seed=1)
    block.values["loss"][2500, 4] = np.nan        # reported NaN: present stays True
    est = estimate_onset_from_block(block)
    assert est.per_signal["non_finite"].low == 2499 and est.per_signal["non_finite"].high == 2500


def test_non_positive_losses_are_analysed_on_a_linear_scale():
    steps, loss, _ = curve()
    shifted = np.log(loss) - 2.0                  # negative values (say, a log-likelihood)
    shifted[steps >= 3000] += 0.3
    est = estimate_onset(steps, loss=shifted)
    assert est.per_signal["loss_trend"].detail["space"] == "linear"
    assert est.low <= 2999 <= est.high


def test_long_histories_are_binned_and_still_bracket_a_drift():
    rng = np.random.default_rng(3)
    n = 200_000
    steps = np.arange(1, n + 1)
    log_loss = np.log(3.0 * steps ** -0.1) + rng.normal(0, 0.02, n)
    log_loss[150_000:] += 2e-5 * np.arange(n - 150_000)
    est = estimate_onset(steps, loss=np.exp(log_loss),
                         params=OnsetParams(max_points=4096))
    lt = est.per_signal["loss_trend"]
    assert lt.detail["bin_steps"] > 1
    assert est.low <= 150_000 <= est.high


def test_estimate_is_json_serialisable_and_rejects_unsorted_steps():
    est = estimate_onset_from_block(run([GradSpike(step=4000, factor=20.0)], n_steps=4010))
    json.dumps(est.to_dict())
    with pytest.raises(ValueError, match="strictly increasing"):
        estimate_onset([3, 2, 1], loss=np.ones(3))


def test_empty_history_has_no_onset():
    assert estimate_onset(np.array([], dtype=np.int64)) is None
    empty = StepBlock(steps=np.array([], dtype=np.int64), ranks=np.arange(2))
    assert estimate_onset_from_block(empty) is None
