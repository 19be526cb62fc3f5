"""RankOutlierDetector: a rank that disagrees persistently with its peers is named."""
from __future__ import annotations

import json

import numpy as np
import pytest

from detectors.frame import StepBlock
from detectors.rank_outlier import RankOutlierDetector
from detectors.simulate import CorruptRank, iter_blocks, simulate_run


def feed(det, block, size=32):
    return [f for b in iter_blocks(block, size) for f in det.update(b)]


def summary(findings):
    return [(f.metric, f.step, f.severity, f.status, f.ranks, f.onset_step) for f in findings]


def trace(*faults, seed=5, **kw):
    return simulate_run(n_steps=4_000, n_ranks=64, seed=seed, faults=list(faults), **kw).block


def test_scaled_local_grad_norm_is_named_then_critical():
    found = feed(RankOutlierDetector(), trace(CorruptRank(step=2_000, rank=20)))
    assert summary(found) == [("local_grad_norm", 2_009, "warning", "firing", (20,), 2_004),
                              ("local_grad_norm", 2_039, "critical", "firing", (20,), 2_004)]
    assert found[0].evidence["direction"] == "high" and found[1].score == 1.0


def test_low_local_grad_norm_is_an_outlier_too():
    found = feed(RankOutlierDetector(), trace(CorruptRank(step=2_000, rank=20, local_grad_scale=1 / 3)))
    assert summary(found)[0] == ("local_grad_norm", 2_011, "warning", "firing", (20,), 2_005)
    assert found[0].evidence["direction"] == "low"


def test_biased_loss_is_caught_by_persistence_and_escalates_by_duration():
    found = feed(RankOutlierDetector(), trace(CorruptRank(step=2_000, rank=20, local_grad_scale=1.0, loss_scale=1.05)))
    assert summary(found) == [("loss", 2_062, "warning", "firing", (20,), 2_019),
                              ("loss", 2_361, "critical", "firing", (20,), 2_019)]
    assert found[1].evidence["persistent"] is True


def test_global_grad_norm_that_differs_on_one_rank():
    found = feed(RankOutlierDetector(), trace(CorruptRank(step=2_000, rank=20, local_grad_scale=1.0, grad_norm_scale=1.01)))
    assert summary(found) == [("grad_norm", 2_002, "warning", "firing", (20,), 2_001),
                              ("grad_norm", 2_068, "critical", "firing", (20,), 2_001)]
    assert found[1].score == pytest.approx(0.5, abs=0.01)


def test_one_glitch_of_the_global_value_is_not_enough():
    block = trace()
    block.values["grad_norm"][1_000, 3] *= 2
    block.values["grad_norm"][1_500, 3] *= 2
    assert feed(RankOutlierDetector(), block) == []


def test_missing_cells_do_not_move_a_rank_and_it_is_still_named():
    found = feed(RankOutlierDetector(), trace(CorruptRank(step=2_000, rank=20), missing_fraction=0.3))
    assert summary(found) == [("local_grad_norm", 2_015, "warning", "firing", (20,), 2_009),
                              ("local_grad_norm", 2_063, "critical", "firing", (20,), 2_009)]


def test_rank_back_with_its_peers_resolves():
    block = trace(CorruptRank(step=2_000, rank=20))
    block.values["local_grad_norm"][2_500:, 20] /= 3.0
    found = feed(RankOutlierDetector(), block)
    # The weighted mean forgets a z of +6 (clipped) in ~300 steps of a 100-step window.
    assert summary(found)[-1] == ("local_grad_norm", 2_817, "info", "resolved", (20,), None)


def test_new_ranks_join_with_fresh_state():
    det = RankOutlierDetector()
    rng = np.random.default_rng(0)
    base = np.exp(rng.normal(0, 0.05, (300, 32)))
    det.update(StepBlock.from_dense(np.arange(300), np.arange(32), local_grad_norm=base))
    later = np.exp(rng.normal(0, 0.05, (300, 40)))
    later[:, 39] *= 3.0                      # the newcomer (rank id 100) disagrees from the start
    ranks = np.r_[np.arange(32), np.arange(100, 108)]
    found = det.update(StepBlock.from_dense(np.arange(300, 600), ranks, local_grad_norm=later))
    assert [(f.step, f.ranks, f.severity) for f in found if f.status == "firing"][0] == (310, (107,), "warning")


def test_state_round_trip_mid_episode():
    block = trace(CorruptRank(step=2_000, rank=20, local_grad_scale=1.0, loss_scale=1.05), missing_fraction=0.05)
    whole = feed(RankOutlierDetector(), block)
    first = RankOutlierDetector()
    head = feed(first, block.slice_steps(0, 2_100))
    restored = RankOutlierDetector()
    restored.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))
    assert head + feed(restored, block.slice_steps(2_100, 4_000)) == whole and len(whole) == 2


def test_stride_judges_every_kth_step_and_still_names_the_rank():
    block = trace(CorruptRank(step=2_000, rank=20))
    found = feed(RankOutlierDetector(stride_steps=4), block, size=29)
    assert summary(found)[:2] == [("local_grad_norm", 2_044, "warning", "firing", (20,), 2_021),
                                  ("local_grad_norm", 2_164, "critical", "firing", (20,), 2_021)]
    assert all(f.step % 4 == 0 for f in found)
    assert feed(RankOutlierDetector(stride_steps=4), block, size=64) == found


def test_default_stride_grows_with_the_rank_count():
    det = RankOutlierDetector()
    assert [det.stride_for(n) for n in (8, 2_048, 2_049, 16_384, 131_072)] == [1, 1, 2, 8, 64]
    assert RankOutlierDetector(stride_steps=3).stride_for(16_384) == 3
