"""Loss and gradient-norm spikes: pinned steps on seeded traces, escalation, blame, warm-up."""
from __future__ import annotations

import json

import numpy as np
import pytest

from detectors.frame import StepBlock
from detectors.simulate import GradSpike, LossSpike, iter_blocks, simulate_run
from detectors.spike import GradSpikeDetector, LossSpikeDetector, SpikeDetector


def feed(det, block, size=32):
    return [f for b in iter_blocks(block, size) for f in det.update(b)]


def summary(findings):
    return [(f.metric, f.step, f.severity, f.status, f.ranks) for f in findings]


def trace(*faults, n_steps=3_000, seed=3):
    return simulate_run(n_steps=n_steps, n_ranks=64, seed=seed, faults=list(faults)).block


def test_job_wide_loss_spike_fires_at_its_step_and_resolves_next_step():
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_200, factor=1.5)))
    assert summary(found) == [("loss", 1_200, "warning", "firing", ()),
                              ("loss", 1_201, "info", "resolved", ())]
    ev = found[0].evidence
    assert ev["scope"] == "job" and ev["ratio"] == pytest.approx(1.5, rel=0.05)
    assert 0.0 < found[0].score <= 1.0 and "leading_signal" not in ev


def test_spike_that_does_not_recover_escalates_then_resolves():
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_500, factor=2.0, duration=100)))
    assert summary(found) == [("loss", 1_500, "warning", "firing", ()),
                              ("loss", 1_520, "critical", "firing", ()),
                              ("loss", 1_600, "info", "resolved", ())]
    assert found[1].onset_step == 1_500 and found[1].evidence["escalated"] is True
    assert found[2].evidence["reason"] == "recovered"


def test_lasting_shift_becomes_the_new_baseline():
    found = feed(LossSpikeDetector(rebaseline_steps=200), trace(LossSpike(step=1_500, factor=2.0, duration=10_000)))
    assert summary(found) == [("loss", 1_500, "warning", "firing", ()),
                              ("loss", 1_520, "critical", "firing", ()),
                              ("loss", 1_700, "info", "resolved", ())]
    assert found[2].evidence["reason"] == "rebaselined"


def test_spike_on_some_ranks_names_them():
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_000, factor=3.0, ranks=(5, 40))))
    assert summary(found) == [("loss", 1_000, "warning", "firing", (5, 40)),
                              ("loss", 1_001, "info", "resolved", (5, 40))]
    assert found[0].evidence["scope"] == "ranks" and found[0].evidence["ratio_to_peers"] > 2.5


def test_rank_spike_that_persists_escalates():
    found = feed(LossSpikeDetector(), trace(LossSpike(step=1_000, factor=3.0, ranks=(7,), duration=100)))
    assert summary(found) == [("loss", 1_000, "warning", "firing", (7,)),
                              ("loss", 1_020, "critical", "firing", (7,)),
                              ("loss", 1_100, "info", "resolved", (7,))]


def test_grad_spike_leads_the_loss_spike():
    block = trace(GradSpike(step=1_000, factor=8.0, lead_steps=3))
    grad = feed(GradSpikeDetector(), block)
    loss = feed(LossSpikeDetector(), block)
    assert summary(grad) == [("grad_norm", 1_000, "warning", "firing", ()),
                             ("grad_norm", 1_001, "info", "resolved", ())]
    assert grad[0].evidence["leading_signal"] is True
    # The loss starts rising the step after and peaks at 1_003; the spike is caught on the rise.
    assert [(f.step, f.status) for f in loss] == [(1_001, "firing"), (1_006, "resolved")]


def test_one_rank_local_grad_spike_is_named_without_a_job_spike():
    block = trace()
    block.values["local_grad_norm"][1_000, 12] *= 10
    assert summary(feed(GradSpikeDetector(), block)) == [
        ("local_grad_norm", 1_000, "warning", "firing", (12,)),
        ("local_grad_norm", 1_001, "info", "resolved", (12,))]


def test_job_spike_names_the_few_ranks_that_stand_out():
    block = trace()
    block.values["local_grad_norm"][1_000, [3, 9]] *= 50
    block.values["grad_norm"][1_000] *= 5
    found = feed(GradSpikeDetector(), block)
    assert summary(found) == [("grad_norm", 1_000, "warning", "firing", (3, 9)),
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
        == ("loss", 1_000, "warning", "firing", ())


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


def test_state_round_trip_mid_episode():
    block = trace(LossSpike(step=1_500, factor=2.0, duration=100), LossSpike(step=2_000, factor=3.0, ranks=(7,), duration=40))
    whole = feed(LossSpikeDetector(), block)
    first = LossSpikeDetector()
    head = feed(first, block.slice_steps(0, 1_510 - 0))          # inside the job-wide episode
    restored = LossSpikeDetector()
    restored.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))
    mid = feed(restored, block.slice_steps(1_510, 2_010))           # inside the rank episode
    again = LossSpikeDetector()
    again.load_state_dict(json.loads(json.dumps(restored.state_dict(), allow_nan=False)))
    assert head + mid + feed(again, block.slice_steps(2_010, block.n_steps)) == whole
    assert len(whole) == 6


def test_constant_input_of_identical_ranks():
    block = StepBlock.from_dense(np.arange(500), np.arange(16), loss=np.full((500, 16), 2.5),
                                 grad_norm=np.full((500, 16), 1.0), local_grad_norm=np.full((500, 16), 1.5))
    assert feed(LossSpikeDetector(), block) == [] and feed(GradSpikeDetector(), block) == []


def test_a_small_job_below_min_ranks_still_has_a_job_wide_loss_spike():
    # 4 ranks: too few for the per-rank view (min_ranks=8), but the median loss is a curve.
    from detectors.simulate import LossSpike, simulate_run
    run = simulate_run(n_steps=400, n_ranks=4, seed=2, faults=[LossSpike(step=300, factor=5.0)])
    found = [(f.step, f.status) for f in LossSpikeDetector().update(run.block) if f.kind == "loss_spike"]
    assert found[0] == (300, "firing")
