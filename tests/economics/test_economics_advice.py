"""Interval advice: observed C and M, the prior, the current interval and the warning."""
import json

import pytest

from healthsvc_detectors.offline.economics.advice import (MtbfPrior, advise_interval, checkpoint_cost_s,
                                                count_failures, current_interval_steps, estimate_mtbf)
from healthsvc_detectors.offline.economics.records import CheckpointWrite, Incident

PRIOR_4H = MtbfPrior(mtbf_s=14_400.0, pseudo_failures=2.0)


def _ckpts(steps, durations):
    return [CheckpointWrite(step=s, uri=f"s3://b/{s}", written_at_s=float(i), duration_s=d)
            for i, (s, d) in enumerate(zip(steps, durations))]


def test_a_stall_and_the_restart_it_causes_count_once():
    incidents = [Incident("stall", 0.0), Incident("restart", 120.0),
                 Incident("non_finite", 7200.0), Incident("loss_spike", 7300.0),
                 Incident("corruption", 20_000.0)]
    assert count_failures(incidents) == 3
    assert count_failures(incidents, merge_window_s=60.0) == 4
    assert count_failures([Incident("hang", 0.0), Incident("other", 1.0)]) == 0


def test_mtbf_is_the_prior_before_any_failure_and_grows_with_clean_run_time():
    first = estimate_mtbf(failures=0, exposure_s=0.0, prior=PRIOR_4H)
    assert (first.mtbf_s, first.source, first.observed_mtbf_s) == (14_400.0, "prior", None)
    # (2 * 14,400 + 28,800) / 2 = 28,800: eight clean hours double a 4 h prior of weight 2
    assert estimate_mtbf(0, 28_800.0, PRIOR_4H).mtbf_s == 28_800.0


def test_mtbf_shrinks_observed_towards_the_prior():
    # One failure in 1 h: (28,800 + 3,600) / 3 = 10,800 s, not the raw 3,600 s.
    one = estimate_mtbf(1, 3_600.0, PRIOR_4H)
    assert one.mtbf_s == pytest.approx(10_800.0)
    assert (one.source, one.observed_mtbf_s, one.prior_weight) == ("blended", 3_600.0, pytest.approx(2 / 3))
    # Ten failures in 10 h: (28,800 + 36,000) / 12 = 5,400 s; prior weight 2/12 <= 0.2.
    ten = estimate_mtbf(10, 36_000.0, PRIOR_4H)
    assert ten.mtbf_s == pytest.approx(5_400.0)
    assert ten.source == "observed"


def test_fleet_prior_pools_other_runs_and_falls_back_to_the_default():
    fleet = MtbfPrior.from_fleet(failures=5, exposure_s=100 * 3600.0)
    assert (fleet.mtbf_s, fleet.source) == (20 * 3600.0, "organisation")
    assert MtbfPrior.from_fleet(failures=0, exposure_s=1e6).source == "default"
    with pytest.raises(ValueError):
        MtbfPrior(mtbf_s=0.0)


def test_checkpoint_cost_is_the_mean_duration_and_interval_skips_resumes():
    ckpts = _ckpts([1000, 2000, 3000, 2000, 3000], [50.0, 60.0, 70.0, None, 60.0])
    assert checkpoint_cost_s(ckpts) == pytest.approx(60.0)
    # gaps 1000, 1000, (resume: -1000 skipped), 1000
    assert current_interval_steps(ckpts) == 1000.0
    assert checkpoint_cost_s(_ckpts([1], [None])) is None
    assert current_interval_steps(_ckpts([1], [1.0])) is None


def test_advice_for_the_issue_case_with_a_sane_interval_has_no_warning():
    # C = mean(50, 60, 70) = 60 s; M = prior 4 h (no failures, no exposure);
    # current = 1000 steps * 2 s = 2000 s; Daly = 1274.838 s -> ratio 1.569 < 2.
    advice = advise_interval(checkpoints=_ckpts([1000, 2000, 3000], [50.0, 60.0, 70.0]),
                             failures=[], exposure_s=0.0, step_time_s=2.0, prior=PRIOR_4H)
    assert advice.checkpoint_cost_s == pytest.approx(60.0)
    assert advice.young_interval_s == pytest.approx(1314.534, abs=1e-3)
    assert advice.daly_interval_s == pytest.approx(1274.838, abs=2e-3)
    assert advice.current_interval_s == 2000.0
    assert advice.current_to_optimum_ratio == pytest.approx(2000 / 1274.838, rel=1e-5)
    assert advice.recommended_interval_steps == 637  # 1274.838 / 2 = 637.4
    assert advice.warning is None
    assert advice.restart_cost_source == "assumed_equal_to_checkpoint_cost"
    assert advice.overhead_at_daly <= advice.overhead_at_young <= advice.overhead_at_current
    json.dumps(advice.to_dict())


def test_warning_when_checkpointing_too_rarely():
    # 3000 steps * 2 s = 6000 s = 4.71x Daly's 1274.8 s
    advice = advise_interval(checkpoints=_ckpts([3000, 6000, 9000], [60.0] * 3), failures=[],
                             exposure_s=0.0, step_time_s=2.0, prior=PRIOR_4H)
    assert advice.warning is not None and "more often" in advice.warning
    assert "637 steps" in advice.warning


def test_warning_when_checkpointing_too_often():
    # 200 steps * 2 s = 400 s = 0.31x the optimum
    advice = advise_interval(checkpoints=_ckpts([200, 400, 600], [60.0] * 3), failures=[],
                             exposure_s=0.0, step_time_s=2.0, prior=PRIOR_4H)
    assert advice.warning is not None and "less often" in advice.warning


def test_observed_failures_and_restart_costs_drive_the_advice():
    # 6 failures in 12 h with prior weight 2 at 4 h: (28,800 + 43,200) / 8 = 9,000 s.
    failures = [Incident("restart", 7200.0 * k) for k in range(1, 7)]
    advice = advise_interval(checkpoints=_ckpts([100, 200], [60.0, 60.0]), failures=failures,
                             exposure_s=43_200.0, step_time_s=1.0, restart_costs_s=[300.0, 500.0],
                             prior=PRIOR_4H)
    assert advice.mtbf.mtbf_s == pytest.approx(9_000.0)
    assert advice.mtbf.failures == 6
    assert (advice.restart_cost_s, advice.restart_cost_source) == (400.0, "observed")
    # Young by hand: sqrt(2 * 60 * 9000) = sqrt(1,080,000) = 1039.23 s
    assert advice.young_interval_s == pytest.approx(1039.23, abs=0.01)


def test_no_checkpoint_durations_means_no_intervals_and_no_warning():
    advice = advise_interval(checkpoints=_ckpts([100, 200], [None, None]), failures=[],
                             exposure_s=100.0, step_time_s=1.0)
    assert advice.young_interval_s is None and advice.daly_interval_s is None
    assert advice.warning is None and advice.restart_cost_source == "none"
    assert advice.current_interval_s == 100.0
