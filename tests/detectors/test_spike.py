"""Loss and gradient-norm spikes: pinned steps on seeded traces, escalation, blame, warm-up, and the
severity policy (a transient spike is ``info``; a lasting, large, recurring or followed one pages)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.frame import StepBlock
from simulation import GradSpike, LossSpike, iter_blocks, simulate_run
from healthsvc_detectors.spike import GradSpikeDetector, LossSpikeDetector, SpikeDetector


def feed(det, block, size=32):
    return [f for b in iter_blocks(block, size) for f in det.update(b)]


def summary(findings):
    return [(f.metric, f.step, f.severity, f.status, f.ranks) for f in findings]


def trace(*faults, n_steps=3_000, seed=3):
    return simulate_run(n_steps=n_steps, n_ranks=64, seed=seed, faults=list(faults)).block


def test_job_wide_loss_spike_fires_at_its_step_and_resolves_next_step():
    # One step at 1.5x: recorded (info, firing) at its step, no page, resolved the next step.
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_200, factor=1.5)))
    assert summary(found) == [("loss", 1_200, "info", "firing", ()),
                              ("loss", 1_201, "info", "resolved", ())]
    ev = found[0].evidence
    assert ev["scope"] == "job" and ev["ratio"] == pytest.approx(1.5, rel=0.05)
    assert ev["reason"] == "transient" and found[1].evidence["was_serious"] is False
    assert 0.0 < found[0].score <= 1.0 and "leading_signal" not in ev


def test_spike_that_does_not_recover_escalates_then_resolves():
    # 2.5x: large, a warning at once; still up after escalate_steps (20): critical.
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_500, factor=2.5, duration=100)))
    assert summary(found) == [("loss", 1_500, "warning", "firing", ()),
                              ("loss", 1_520, "critical", "firing", ()),
                              ("loss", 1_600, "info", "resolved", ())]
    assert found[0].evidence["reason"] == "large"
    assert found[1].onset_step == 1_500 and found[1].evidence["escalated"] is True
    assert found[2].evidence["reason"] == "recovered" and found[2].evidence["was_serious"] is True


def test_a_spike_of_exactly_twice_the_baseline_is_judged_on_the_measured_ratio():
    # The injected 2.0x reads 1.985x against the baseline at its first step (under large_ratio:
    # info); two steps on the falling curve puts it past 2x: the warning ("large") then, with the
    # onset at the spike.
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_500, factor=2.0, duration=100)))
    assert [(f.step, f.severity, f.status, f.onset_step, f.evidence["reason"]) for f in found] == [
        (1_500, "info", "firing", 1_500, "transient"), (1_502, "warning", "firing", 1_500, "large"),
        (1_520, "critical", "firing", 1_500, "not recovering"), (1_600, "info", "resolved", 1_500, "recovered")]
    assert found[0].evidence["ratio"] < 2.0 <= found[1].evidence["ratio"]


def test_lasting_shift_becomes_the_new_baseline():
    found = feed(LossSpikeDetector(rebaseline_steps=200), trace(LossSpike(step=1_500, factor=2.5, duration=10_000)))
    assert summary(found) == [("loss", 1_500, "warning", "firing", ()),
                              ("loss", 1_520, "critical", "firing", ()),
                              ("loss", 1_700, "info", "resolved", ())]
    assert found[2].evidence["reason"] == "rebaselined"


def test_spike_on_some_ranks_names_them():
    # 3x on two ranks: past large_ratio beyond where they usually sit, a warning at once.
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_000, factor=3.0, ranks=(5, 40))))
    assert summary(found) == [("loss", 1_000, "warning", "firing", (5, 40)),
                              ("loss", 1_001, "info", "resolved", (5, 40))]
    ev = found[0].evidence
    assert ev["scope"] == "ranks" and ev["reason"] == "large" and ev["ratio_to_usual"] > 2.5


def test_rank_spike_that_persists_escalates():
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_000, factor=3.0, ranks=(7,), duration=100)))
    assert summary(found) == [("loss", 1_000, "warning", "firing", (7,)),
                              ("loss", 1_020, "critical", "firing", (7,)),
                              ("loss", 1_100, "info", "resolved", (7,))]


def test_grad_spike_leads_the_loss_spike():
    block = trace(GradSpike(step=1_000, factor=8.0, lead_steps=3))
    grad = feed(GradSpikeDetector(), block)
    loss = feed(LossSpikeDetector(), block)
    # Named at its own step, before the loss moves (its severity: see the test below).
    assert [(f.metric, f.step, f.status, f.ranks) for f in grad if f.severity == "info"] == [
        ("grad_norm", 1_000, "firing", ()), ("grad_norm", 1_001, "resolved", ())]
    assert grad[0].step == 1_000 and grad[0].evidence["leading_signal"] is True
    # The loss starts rising the step after and peaks at 1_003 (1.6x); the spike is caught on
    # the rise and is back within confirm_steps (1_006 = 1_001 + 5): transient, info.
    assert [(f.step, f.severity, f.status) for f in loss] == [(1_001, "info", "firing"), (1_006, "info", "resolved")]


def test_grad_spike_whose_loss_follows_pages():
    block = trace(GradSpike(step=1_000, factor=8.0, lead_steps=3))
    grad = feed(GradSpikeDetector(), block)
    warned = [f for f in grad if f.severity == "warning" and f.status == "firing"]
    # The loss is 12 % up at 1_001 (the first quarter of its 1.6x ramp): followed within 5 steps.
    assert [(f.onset_step, f.evidence["reason"]) for f in warned] == [(1_000, "loss followed")]
    assert 1_001 <= warned[0].step <= 1_005


def test_one_rank_local_grad_spike_is_named_without_a_job_spike():
    # 10x for one step on one rank: named, but a gradient norm's size alone is no page (info).
    block = trace()
    block.values["local_grad_norm"][1_000, 12] *= 10
    found = feed(GradSpikeDetector(), block)
    assert summary(found) == [
        ("local_grad_norm", 1_000, "info", "firing", (12,)),
        ("local_grad_norm", 1_001, "info", "resolved", (12,))]
    assert found[0].evidence["scope"] == "ranks" and found[0].evidence["ratio_to_usual"] > 8


def test_job_spike_names_the_few_ranks_that_stand_out():
    block = trace()
    block.values["local_grad_norm"][1_000, [3, 9]] *= 50
    block.values["grad_norm"][1_000] *= 5
    found = feed(GradSpikeDetector(), block)
    assert summary(found) == [("grad_norm", 1_000, "info", "firing", (3, 9)),
                              ("grad_norm", 1_001, "info", "resolved", (3, 9))]
    assert found[0].evidence["ranks_standing_out"] == 2


def test_nothing_is_judged_during_warm_up():
    assert feed(LossSpikeDetector(warmup_steps=50), trace(LossSpike(step=20, factor=3.0))) == []


def test_a_drop_is_not_a_spike():
    assert feed(LossSpikeDetector(), trace(LossSpike(step=1_000, factor=0.5))) == []


def test_small_rise_below_min_rise_is_not_a_spike():
    # 9.5 % is past the z threshold here (6.3 sds) but below the 10 % floor.
    assert feed(LossSpikeDetector(), trace(LossSpike(step=1_000, factor=1.095))) == []
    assert summary(feed(LossSpikeDetector(min_rise=0.05), trace(LossSpike(step=1_000, factor=1.095))))[0] \
        == ("loss", 1_000, "info", "firing", ())


def test_missing_metric_produces_nothing():
    run = simulate_run(n_steps=500, n_ranks=16, seed=1, metrics=("step_time",))
    assert feed(LossSpikeDetector(), run.block) == [] and feed(GradSpikeDetector(), run.block) == []


def test_non_finite_values_are_left_to_the_non_finite_detector():
    block = trace()
    block.values["loss"][1_000:, :] = np.nan
    block.values["loss"][1_000:1_010, 0] = np.inf
    assert feed(LossSpikeDetector(), block) == []


def test_kind_is_validated_and_params_are_reported():
    with pytest.raises(ValueError, match="kind"):
        SpikeDetector(kind="straggler")
    params = GradSpikeDetector(z_threshold=7.0).params()
    assert params["z_threshold"] == 7.0 and params["metric"] == "grad_norm" and params["leading_signal"]
    assert "GradSpikeDetector(" in repr(GradSpikeDetector())


@pytest.mark.parametrize("cuts", [(1_502, 2_003), (1_510, 2_010)])
def test_state_round_trip_mid_episode(cuts):
    # A 1.5x job-wide spike that lasts (info at 1_500, "lasting" warning at 1_505) and a 1.8x
    # rank spike that lasts (info at 2_000, warning at 2_005): the first cuts fall between the
    # info and the warning (the episode's policy state must survive), the second after it.
    block = trace(LossSpike(step=1_500, factor=1.5, duration=100), LossSpike(step=2_000, factor=1.8, ranks=(7,), duration=40))
    whole = feed(LossSpikeDetector(), block)
    assert [(f.step, f.severity, f.status, f.ranks) for f in whole] == [
        (1_500, "info", "firing", ()), (1_505, "warning", "firing", ()), (1_520, "critical", "firing", ()),
        (1_600, "info", "resolved", ()), (2_000, "info", "firing", (7,)), (2_005, "warning", "firing", (7,)),
        (2_020, "critical", "firing", (7,)), (2_040, "info", "resolved", (7,))]
    a, b = cuts
    first = LossSpikeDetector()
    head = feed(first, block.slice_steps(0, a))
    restored = LossSpikeDetector()
    restored.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))
    mid = feed(restored, block.slice_steps(a, b))
    again = LossSpikeDetector()
    again.load_state_dict(json.loads(json.dumps(restored.state_dict(), allow_nan=False)))
    assert head + mid + feed(again, block.slice_steps(b, block.n_steps)) == whole


def test_constant_input_of_identical_ranks():
    block = StepBlock.from_dense(np.arange(500), np.arange(16), loss=np.full((500, 16), 2.5),
                                 grad_norm=np.full((500, 16), 1.0), local_grad_norm=np.full((500, 16), 1.5))
    assert feed(LossSpikeDetector(), block) == [] and feed(GradSpikeDetector(), block) == []


def test_a_small_job_has_a_job_wide_loss_spike():
    # 4 ranks: the median loss is a curve like any other; 5x is large, a warning at once.
    run = simulate_run(n_steps=400, n_ranks=4, seed=2, faults=[LossSpike(step=300, factor=5.0)])
    found = [(f.step, f.severity, f.status, f.ranks) for f in LossSpikeDetector().update(run.block)]
    assert found == [(300, "warning", "firing", ()), (301, "info", "resolved", ())]


def test_min_ranks_below_two_is_refused():
    with pytest.raises(ValueError, match="min_ranks"):
        LossSpikeDetector(min_ranks=1)
    assert LossSpikeDetector().min_ranks == 2


# ----------------------------------------------------------------- the severity policy (new)
def sev(findings):
    return [(f.metric, f.step, f.severity, f.status, f.ranks, f.onset_step, f.evidence["reason"])
            for f in findings]


@pytest.mark.parametrize("ranks", [None, (7,)], ids=["job", "rank"])
def test_a_transient_loss_spike_is_info_and_a_lasting_one_pages_at_spike_step_plus_confirm_steps(ranks):
    # 1.5x job-wide / 1.8x on one rank: over the entry thresholds, under large_ratio (2x).
    factor = 1.5 if ranks is None else 1.8
    named = () if ranks is None else ranks
    five = feed(LossSpikeDetector(), trace(LossSpike(step=1_200, factor=factor, duration=5, ranks=ranks)))
    assert [(f.step, f.severity, f.status, f.ranks) for f in five] == [
        (1_200, "info", "firing", named), (1_205, "info", "resolved", named)]
    six = feed(LossSpikeDetector(), trace(LossSpike(step=1_200, factor=factor, duration=6, ranks=ranks)))
    assert sev(six)[:2] == [("loss", 1_200, "info", "firing", named, 1_200, "transient"),
                            ("loss", 1_205, "warning", "firing", named, 1_200, "lasting")]
    assert [(f.step, f.status) for f in six[2:]] == [(1_206, "resolved")]
    # The same spike with confirm_steps=3: the page comes at 1_200 + 3.
    three = feed(LossSpikeDetector(confirm_steps=3), trace(LossSpike(step=1_200, factor=factor, duration=6, ranks=ranks)))
    assert [(f.step, f.severity, f.onset_step) for f in three if f.status == "firing"] == [
        (1_200, "info", 1_200), (1_203, "warning", 1_200)]


@pytest.mark.parametrize("ranks", [None, (7,)], ids=["job", "rank"])
def test_a_loss_spike_past_twice_its_baseline_is_a_warning_at_once(ranks):
    named = () if ranks is None else ranks
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_200, factor=2.2, ranks=ranks)))
    assert sev(found)[0] == ("loss", 1_200, "warning", "firing", named, 1_200, "large")
    assert [(f.step, f.status) for f in found[1:]] == [(1_201, "resolved")]
    # large_ratio=None: size alone is no page; the one-step spike stays info.
    assert [f.severity for f in feed(LossSpikeDetector(large_ratio=None),
                                     trace(LossSpike(step=1_200, factor=2.2, ranks=ranks)))] == ["info", "info"]


def _grad_jumps(*steps, factor=4.0):
    block = trace()
    for s in steps:
        block.values["grad_norm"][s] *= factor
        block.values["local_grad_norm"][s] *= factor
    return block


def test_a_lone_gradient_norm_jump_is_info():
    found = feed(GradSpikeDetector(), _grad_jumps(1_000))
    assert sev(found) == [("grad_norm", 1_000, "info", "firing", (), 1_000, "transient"),
                          ("grad_norm", 1_001, "info", "resolved", (), 1_000, "recovered")]
    assert found[0].evidence["leading_signal"] is True and found[0].evidence["ratio"] > 3


def test_the_third_gradient_spike_within_50_steps_is_a_warning():
    found = [f for f in feed(GradSpikeDetector(), _grad_jumps(1_000, 1_020, 1_040)) if f.status == "firing"]
    assert sev(found) == [("grad_norm", 1_000, "info", "firing", (), 1_000, "transient"),
                          ("grad_norm", 1_020, "info", "firing", (), 1_020, "transient"),
                          ("grad_norm", 1_040, "warning", "firing", (), 1_040, "recurring")]
    # Far apart, they stay info.
    spaced = [f for f in feed(GradSpikeDetector(), _grad_jumps(1_000, 1_100, 1_200)) if f.status == "firing"]
    assert [f.severity for f in spaced] == ["info", "info", "info"]


def test_three_gradient_spikes_spanning_more_than_50_steps_are_not_recurring():
    found = [f for f in feed(GradSpikeDetector(), _grad_jumps(1_000, 1_049, 1_098)) if f.status == "firing"]
    assert [f.severity for f in found] == ["info", "info", "info"]


def _grad_then_loss(grad_steps, loss_factor):
    block = trace()
    block.values["grad_norm"][grad_steps] *= 4.0
    block.values["local_grad_norm"][grad_steps] *= 4.0
    block.values["loss"][1_002:1_005] *= loss_factor       # the loss follows 2 steps later
    return block


def test_a_gradient_spike_that_is_still_up_when_the_loss_follows_pages():
    found = feed(GradSpikeDetector(), _grad_then_loss(slice(1_000, 1_003), 1.15))
    assert sev(found) == [("grad_norm", 1_000, "info", "firing", (), 1_000, "transient"),
                          ("grad_norm", 1_002, "warning", "firing", (), 1_000, "loss followed"),
                          ("grad_norm", 1_003, "info", "resolved", (), 1_000, "recovered")]


def test_a_gradient_spike_followed_by_a_small_loss_rise_stays_info():
    found = feed(GradSpikeDetector(), _grad_then_loss(slice(1_000, 1_003), 1.05))   # 5 % < follow_rise
    assert [f.severity for f in found] == ["info", "info"]


def test_a_one_step_gradient_spike_followed_by_a_loss_rise_pages():
    found = feed(GradSpikeDetector(), _grad_then_loss(1_000, 1.15))
    warned = [f for f in found if f.severity == "warning"]
    assert [(f.onset_step, f.evidence["reason"]) for f in warned] == [(1_000, "loss followed")]
    assert 1_002 <= warned[0].step <= 1_005


# --------------------------------------------------------- per-rank views at any world size (new)
def _small(n_ranks, seed, faults=(), n_steps=1_500):
    return simulate_run(n_steps=n_steps, n_ranks=n_ranks, seed=seed, faults=list(faults)).block


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_garbage_batch_on_one_rank_of_four_names_that_rank(seed):
    block = _small(4, seed, [LossSpike(step=1_000, factor=4.0, duration=5, ranks=(1,))])
    found = feed(LossSpikeDetector(), block)
    assert sev(found)[0] == ("loss", 1_000, "warning", "firing", (1,), 1_000, "large")
    assert found[0].evidence["scope"] == "ranks" and found[0].evidence["ratio_to_usual"] > 3
    assert [(f.step, f.status, f.ranks) for f in found[1:]] == [(1_005, "resolved", (1,))]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_garbage_batch_on_one_rank_of_two_names_that_rank(seed):
    block = _small(2, seed, [LossSpike(step=1_000, factor=4.0, duration=5, ranks=(1,))])
    found = feed(LossSpikeDetector(), block)
    firing = [f for f in found if f.status == "firing"]
    assert firing and all(f.ranks == (1,) for f in firing)
    assert firing[0].step == 1_000 and firing[0].severity == "warning"


@pytest.mark.parametrize("n_ranks", [2, 4])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_rank_with_a_constant_normal_offset_is_never_flagged(n_ranks, seed):
    # Rank 1's loss always 10 % above its peers', its local gradient norm 30 % above: its normal.
    block = _small(n_ranks, seed, n_steps=3_000)
    block.values["loss"][:, 1] *= 1.1
    block.values["local_grad_norm"][:, 1] *= 1.3
    assert feed(LossSpikeDetector(), block) == [] and feed(GradSpikeDetector(), block) == []
    # ... while the same trace with a real spike on that rank is caught (the view is live).
    block.values["loss"][2_000, 1] *= 3.0
    assert [(f.step, f.ranks) for f in feed(LossSpikeDetector(), block) if f.status == "firing"][0][0] == 2_000


def test_a_rank_is_judged_only_after_rank_warmup_steps_values_of_its_own():
    # Rank 5 reports from step 1_000 on; a 4x garbage batch among its first 50 values is not
    # judged (its usual place among its peers is still being learned); one after them is.
    block = trace()
    for m in block.present:
        block.present[m][:1_000, 5] = False
        block.values[m][:1_000, 5] = np.nan
    early, late = block.values["loss"].copy(), block.values["loss"].copy()
    early[1_030, 5] *= 4.0
    late[1_080, 5] *= 4.0
    block.values["loss"] = early
    assert feed(LossSpikeDetector(), block) == []
    block.values["loss"] = late
    assert [(f.step, f.severity, f.ranks) for f in feed(LossSpikeDetector(), block) if f.status == "firing"] == [
        (1_080, "warning", (5,))]


def test_a_rank_spike_escalates_only_while_at_least_half_its_peak_rise_remains():
    # 3x for one step, then 1.4x for 39 steps: still above its peers, but well under half the
    # peak rise (log 1.4 < log 3 / 2). The job view's rule (see the job-wide twin below).
    block = trace()
    block.values["loss"][1_000, 7] *= 3.0
    block.values["loss"][1_001:1_040, 7] *= 1.4
    job = trace()
    job.values["loss"][1_000] *= 3.0
    job.values["loss"][1_001:1_040] *= 1.15
    assert [f.severity for f in feed(LossSpikeDetector(), job)] == ["warning", "info"]
    assert "critical" not in [f.severity for f in feed(LossSpikeDetector(), block)]
