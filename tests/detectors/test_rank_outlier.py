"""RankOutlierDetector: a rank that disagrees persistently with its peers is named."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.rank_outlier import RankOutlierDetector
from simulation import CorruptRank, iter_blocks, simulate_run


def feed(det, block, size=32):
    return [f for b in iter_blocks(block, size) for f in det.update(b)]


def summary(findings):
    return [(f.metric, f.step, f.severity, f.status, f.ranks, f.onset_step) for f in findings]


def trace(*faults, seed=5, **kw):
    return simulate_run(n_steps=4_000, n_ranks=64, seed=seed, faults=list(faults), **kw).block


def test_scaled_local_grad_norm_is_named_then_critical():
    found = feed(RankOutlierDetector(), trace(CorruptRank(step=2_000, rank=20)))
    assert summary(found) == [("local_grad_norm", 2_008, "warning", "firing", (20,), 2_003),
                              ("local_grad_norm", 2_038, "critical", "firing", (20,), 2_003)]
    assert found[0].evidence["direction"] == "high" and found[1].score == 1.0


def test_low_local_grad_norm_is_an_outlier_too():
    found = feed(RankOutlierDetector(), trace(CorruptRank(step=2_000, rank=20, local_grad_scale=1 / 3)))
    assert summary(found)[0] == ("local_grad_norm", 2_012, "warning", "firing", (20,), 2_007)
    assert found[0].evidence["direction"] == "low"


def test_biased_loss_is_caught_by_persistence_and_escalates_by_duration():
    found = feed(RankOutlierDetector(), trace(CorruptRank(step=2_000, rank=20, local_grad_scale=1.0, loss_scale=1.05)))
    firing = [f for f in found if f.status == "firing"]
    # z in the rank's own sds of deviating from its peers: ~0.75 per step for this bias, so the
    # 100-step mean passes 0.6 after ~200 steps (it was ~60 with the cross-rank IQR).
    assert summary(firing) == [("loss", 2_176, "warning", "firing", (20,), 2_048),
                               ("loss", 2_475, "critical", "firing", (20,), 2_048)]
    assert firing[1].evidence["persistent"] is True


def test_a_lasting_bias_is_not_absorbed_into_the_ranks_normal():
    found = feed(RankOutlierDetector(), trace(CorruptRank(step=2_000, rank=20, local_grad_scale=1.0, loss_scale=1.05)))
    assert [f for f in found if f.status == "resolved"] == []


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
    assert summary(found) == [("local_grad_norm", 2_013, "warning", "firing", (20,), 2_006),
                              ("local_grad_norm", 2_058, "critical", "firing", (20,), 2_006)]


def test_rank_back_with_its_peers_resolves():
    block = trace(CorruptRank(step=2_000, rank=20))
    block.values["local_grad_norm"][2_500:, 20] /= 3.0
    found = feed(RankOutlierDetector(), block)
    # The weighted mean forgets a z of +6 (clipped) in ~300 steps of a 100-step window.
    assert summary(found)[-1] == ("local_grad_norm", 2_822, "info", "resolved", (20,), None)


def _joining(bad_from: int):
    """32 ranks for 300 steps, then 8 more (ids 100..107) join; rank 107's local gradient norm
    is 3x from row ``bad_from`` of the second block on."""
    det = RankOutlierDetector()
    rng = np.random.default_rng(0)
    base = np.exp(rng.normal(0, 0.05, (300, 32)))
    assert det.update(StepBlock.from_dense(np.arange(300), np.arange(32), local_grad_norm=base)) == []
    later = np.exp(rng.normal(0, 0.05, (300, 40)))
    later[bad_from:, 39] *= 3.0
    ranks = np.r_[np.arange(32), np.arange(100, 108)]
    return det.update(StepBlock.from_dense(np.arange(300, 600), ranks, local_grad_norm=later))


def test_new_ranks_join_with_fresh_state():
    # The newcomers are judged by their warm peers' statistics while they learn their own usual
    # place over warmup_steps (50) values: rank 107 goes bad at step 400 (its 101st value) and is
    # named.
    found = _joining(100)
    assert [(f.step, f.ranks, f.severity, f.onset_step) for f in found if f.status == "firing"] == [
        (410, (107,), "warning", 405), (440, (107,), "critical", 405)]


def test_a_rank_that_disagrees_from_the_moment_it_joins_is_named():
    # Rank 107 joins warm peers 3x from its first value (step 300): it is judged against its
    # peers' offsets and spread from then on, named within ~10 steps, and its own warm-up does
    # not make the disagreement its normal place (its offset is kept within its peers' band):
    # it stays named, with no resolution, and it is the only rank named.
    found = _joining(0)
    assert [(f.step, f.ranks, f.severity, f.status) for f in found] == [
        (310, (107,), "warning", "firing"), (340, (107,), "critical", "firing")]


def test_a_newcomer_like_its_peers_in_a_warm_job_is_not_named():
    # The same join with no fault, and with the newcomers' usual place 5 % off their peers'
    # (within their spread): judged by their peers meanwhile, nobody is named.
    assert _joining(300) == []
    det = RankOutlierDetector()
    rng = np.random.default_rng(1)
    det.update(StepBlock.from_dense(np.arange(300), np.arange(32),
                                    local_grad_norm=np.exp(rng.normal(0, 0.05, (300, 32)))))
    later = np.exp(rng.normal(0, 0.05, (600, 40)))
    later[:, 32:] *= 1.05
    ranks = np.r_[np.arange(32), np.arange(100, 108)]
    assert det.update(StepBlock.from_dense(np.arange(300, 900), ranks, local_grad_norm=later)) == []


def test_state_round_trip_mid_episode():
    block = trace(CorruptRank(step=2_000, rank=20, local_grad_scale=1.0, loss_scale=1.05), missing_fraction=0.05)
    whole = feed(RankOutlierDetector(), block)
    first = RankOutlierDetector()
    head = feed(first, block.slice_steps(0, 2_100))
    restored = RankOutlierDetector()
    restored.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))
    assert head + feed(restored, block.slice_steps(2_100, 4_000)) == whole
    assert [(f.step, f.severity) for f in whole if f.status == "firing"] == [(2_216, "warning"), (2_530, "critical")]


def test_stride_judges_every_kth_step_and_still_names_the_rank():
    block = trace(CorruptRank(step=2_000, rank=20))
    found = feed(RankOutlierDetector(stride_steps=4), block, size=29)
    assert summary(found)[:2] == [("local_grad_norm", 2_040, "warning", "firing", (20,), 2_017),
                                  ("local_grad_norm", 2_160, "critical", "firing", (20,), 2_017)]
    assert all(f.step % 4 == 0 for f in found)
    assert feed(RankOutlierDetector(stride_steps=4), block, size=64) == found


def test_default_stride_grows_with_the_rank_count():
    det = RankOutlierDetector()
    assert [det.stride_for(n) for n in (8, 2_048, 2_049, 16_384, 131_072)] == [1, 1, 2, 8, 64]
    assert RankOutlierDetector(stride_steps=3).stride_for(16_384) == 3


# ------------------------------------------------------------- small jobs, own history (new)
def _small(n_ranks, seed, faults=(), n_steps=3_000):
    return simulate_run(n_steps=n_steps, n_ranks=n_ranks, seed=seed, faults=list(faults)).block


@pytest.mark.parametrize("n_ranks, seed, expected", [
    (4, 1, [("local_grad_norm", 1_509, "warning", "firing", (1,), 1_504),
            ("local_grad_norm", 1_539, "critical", "firing", (1,), 1_504)]),
    (4, 2, [("local_grad_norm", 1_512, "warning", "firing", (1,), 1_506),
            ("local_grad_norm", 1_542, "critical", "firing", (1,), 1_506)]),
    # Two ranks: the pair is named (no majority tells which of them moved).
    (2, 1, [("local_grad_norm", 1_509, "warning", "firing", (0, 1), 1_503),
            ("local_grad_norm", 1_539, "critical", "firing", (0, 1), 1_503)]),
])
def test_a_corrupted_rank_is_named_in_a_small_job(n_ranks, seed, expected):
    # local_grad_norm x3 on rank 1 from step 1_500: named within ~10 steps at 4 (and 2) ranks.
    found = feed(RankOutlierDetector(), _small(n_ranks, seed, [CorruptRank(step=1_500, rank=1)]))
    assert summary(found) == expected
    assert found[0].evidence["direction"] == ("apart" if n_ranks == 2 else "high")


@pytest.mark.parametrize("n_ranks", [2, 4])
def test_a_rank_with_a_constant_normal_offset_is_not_an_outlier(n_ranks):
    # Rank 1's loss always 10 % above its peers', its local gradient norm 30 %: its normal place.
    block = _small(n_ranks, 1)
    block.values["loss"][:, 1] *= 1.1
    block.values["local_grad_norm"][:, 1] *= 1.3
    assert feed(RankOutlierDetector(), block) == []
    # The same rank going bad on top of its offset is still named.
    block.values["local_grad_norm"][1_500:, 1] *= 3.0
    assert summary(feed(RankOutlierDetector(), block))[0][2:5] == (
        "warning", "firing", (1,) if n_ranks > 2 else (0, 1))


def _burst_in_warm_up():
    # Rank 2's values 3x for 10 steps among its first 50 (its warm-up).
    block = _small(4, 3, n_steps=1_500)
    block.values["local_grad_norm"][10:20, 2] *= 3.0
    block.values["loss"][10:20, 2] *= 3.0
    return block


def test_nothing_is_judged_before_a_rank_has_warmup_steps_values():
    assert [f for f in feed(RankOutlierDetector(), _burst_in_warm_up()) if f.step < 50] == []
    # The same kind of burst (15 steps of 3x local gradient norm) once the rank is warm is named
    # within a few steps.
    block = _small(4, 3, n_steps=1_500)
    block.values["local_grad_norm"][300:315, 2] *= 3.0
    assert summary(feed(RankOutlierDetector(), block))[0] == ("local_grad_norm", 305, "warning", "firing", (2,), 300)


def test_a_burst_during_warm_up_does_not_make_the_rank_an_outlier_later():
    # Warm-up learns the mean of the values within 3 sds of their median: the burst is not
    # learned (it was a plain running mean: warning at 261, critical at 560).
    assert feed(RankOutlierDetector(), _burst_in_warm_up()) == []
    # And at 64 ranks (it was 249/548), with the same burst.
    block = _small(64, 3, n_steps=1_500)
    block.values["local_grad_norm"][10:20, 2] *= 3.0
    block.values["loss"][10:20, 2] *= 3.0
    assert feed(RankOutlierDetector(), block) == []


def test_min_ranks_below_two_is_refused():
    with pytest.raises(ValueError, match="min_ranks"):
        RankOutlierDetector(min_ranks=1)
    assert RankOutlierDetector().min_ranks == 2 and RankOutlierDetector().warmup_steps == 50


def test_in_a_two_rank_job_a_low_corruption_names_the_pair_never_the_healthy_rank_alone():
    # Rank 0's local gradient norm drops to 0.4x: of two ranks that is rank 1 rising over its one
    # peer just as much. Nothing tells which moved, so every finding names the pair and says so.
    from healthsvc_detectors.peers import PAIR_NOTE
    from healthsvc_detectors.spike import GradSpikeDetector
    block = _small(2, 1, [CorruptRank(step=1_500, rank=0, local_grad_scale=0.4)])
    outlier, spike = feed(RankOutlierDetector(), block), feed(GradSpikeDetector(), block)
    assert summary(outlier) == [("local_grad_norm", 1_509, "warning", "firing", (0, 1), 1_503),
                                ("local_grad_norm", 1_539, "critical", "firing", (0, 1), 1_503)]
    assert [(f.step, f.ranks, f.severity, f.evidence["reason"]) for f in spike] == [
        (1_500, (0, 1), "info", "transient"), (1_505, (0, 1), "warning", "lasting"),
        (1_520, (0, 1), "critical", "not recovering")]
    for f in outlier + spike:
        assert f.evidence["pair"] is True and f.evidence["note"] == PAIR_NOTE
    assert outlier[0].evidence["direction"] == "apart"
    assert outlier[0].evidence["mean_z"][0] == pytest.approx(-outlier[0].evidence["mean_z"][1])
    assert spike[0].evidence["rose"] == [1]


# ------------------------------------------------- a corrupted rank does not move its peers
def test_a_corrupted_rank_in_a_small_job_does_not_make_its_healthy_peers_outliers():
    # Rank 2's local gradient norm 1.25x from step 800 on (noise added to its gradient). Its peers
    # are judged against the median of the others but the current suspects, so they do not look
    # "low" because it moved the centre (they were named warning, then critical, for hundreds of
    # steps at 3 and 4 ranks when every rank was judged against the median of all).
    found = feed(RankOutlierDetector(), _small(4, 0, [CorruptRank(step=800, rank=2, local_grad_scale=1.25)],
                                               n_steps=2_000))
    assert summary(found) == [("local_grad_norm", 839, "warning", "firing", (2,), 817),
                              ("local_grad_norm", 1_138, "critical", "firing", (2,), 817)]


@pytest.mark.parametrize("n_ranks", [3, 4, 5])
@pytest.mark.parametrize("scale", [1.12, 1.5, 3.0])
def test_only_the_corrupted_rank_is_ever_named(n_ranks, scale):
    for seed in range(4):
        block = _small(n_ranks, seed, [CorruptRank(step=800, rank=2, local_grad_scale=scale)], n_steps=2_000)
        named = {f.ranks for f in feed(RankOutlierDetector(), block) if f.status == "firing"}
        assert named == {(2,)}, (seed, named)


# ------------------------------------------------- a lasting offset after a jump (replica bit flip)
def _bit_flip(n_ranks, seed, lasting=1.01):
    """A replica's weight bit-flipped at step 900: its loss 1.65x for that step, then ``lasting``
    x its peers' for good (replicas never re-sync). A larger batch than ``_small``'s (per-rank
    loss spread 2 %), as in a training where the 1.65x step stands out as a per-rank spike."""
    block = simulate_run(n_steps=2_000, n_ranks=n_ranks, seed=seed, loss_rank_sigma=0.02).block
    block.values["loss"][900, 1] *= 1.65
    block.values["loss"][901:, 1] *= lasting
    return block


def test_a_lasting_offset_after_a_jump_is_evidence_dated_at_the_jump():
    from healthsvc_detectors.offline.rollback.decision import decide_rollback
    from healthsvc_detectors.offline.rollback.records import Checkpoint
    from healthsvc_detectors.spike import LossSpikeDetector
    block = _bit_flip(4, 0)
    found, spike = feed(RankOutlierDetector(), block), feed(LossSpikeDetector(), block)
    # The jump alone is a transient per-rank spike (info); the 1 % that stays after it is not
    # enough for the weighted mean (z ~ 0.2), but after the jump it is evidence, dated at it.
    assert [(f.step, f.severity, f.evidence["reason"]) for f in spike] == [
        (900, "info", "transient"), (901, "info", "recovered")]
    assert summary(found) == [("loss", 931, "warning", "firing", (1,), 900)]
    assert found[0].evidence["reason"] == "lasting offset after a jump"
    assert found[0].evidence["jump_step"] == 900 and found[0].evidence["offset_stat"] >= 4.0
    # So the rollback answer goes before the jump, not to the newest checkpoint (1,900).
    ckpts = [Checkpoint(step=s) for s in range(100, 2_000, 100)]
    assert decide_rollback(block, spike, ckpts).checkpoint.step == 1_900
    decision = decide_rollback(block, found + spike, ckpts)
    # The detector saw the jump: the episode takes the abrupt window, and the answer is the
    # newest checkpoint before it.
    assert decision.checkpoint.step == 800
    assert [(e["onset"], e["window"], e["jump_step"]) for e in decision.evidence["episodes"] if e["evidence"]] == \
        [(900, "abrupt", 900)]


@pytest.mark.parametrize("n_ranks, seed, step", [(4, 1, 1_101), (4, 2, 976), (8, 0, 952), (8, 3, 1_219)])
def test_a_lasting_offset_after_a_jump_is_found_at_other_seeds_and_sizes(n_ranks, seed, step):
    # 1 % against a 2 % spread (z ~ 0.2-0.3 a step): 50-320 steps after the jump.
    found = feed(RankOutlierDetector(), _bit_flip(n_ranks, seed))
    assert summary(found) == [("loss", step, "warning", "firing", (1,), 900)]


def test_a_jump_that_leaves_no_offset_is_forgotten():
    # The same jump with no lasting offset (a hard batch), and five garbage batches on one rank:
    # every replica applied the same update, so nothing stays and nothing is named.
    for seed in range(4):
        assert feed(RankOutlierDetector(), _bit_flip(4, seed, lasting=1.0)) == [], seed
        block = simulate_run(n_steps=2_000, n_ranks=4, seed=seed, loss_rank_sigma=0.02).block
        block.values["loss"][900:905, 1] *= 3.0
        assert feed(RankOutlierDetector(), block) == [], seed


def test_in_a_two_rank_job_a_lasting_offset_after_a_jump_names_the_pair():
    from healthsvc_detectors.peers import PAIR_NOTE
    found = feed(RankOutlierDetector(), _bit_flip(2, 1))
    assert summary(found) == [("loss", 1_004, "warning", "firing", (0, 1), 900)]
    assert found[0].evidence["pair"] is True and found[0].evidence["note"] == PAIR_NOTE
    assert found[0].evidence["jumped"] == [1] and found[0].evidence["direction"] == "apart"


def test_a_lasting_offset_after_a_jump_is_the_same_however_the_input_is_split():
    block = _bit_flip(4, 0)
    whole = feed(RankOutlierDetector(), block, size=2_000)
    first = RankOutlierDetector()
    head = feed(first, block.slice_steps(0, 910), size=7)
    restored = RankOutlierDetector()
    restored.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))
    assert head + feed(restored, block.slice_steps(910, 2_000), size=13) == whole
    assert summary(whole) == [("loss", 931, "warning", "firing", (1,), 900)]


# ---------------------------------------------- a replica's weight bit flip, on real recordings
def _recorded(name: str) -> StepBlock:
    """One of our real recordings (tests/quality/traces, examples/record_trace.py): the values."""
    import gzip
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "quality" / "traces" / name / "records.jsonl.gz"
    recs = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    steps, ranks = sorted({r["step"] for r in recs}), sorted({r["rank"] for r in recs})
    fields = {"loss": "loss", "grad_norm": "grad_norm", "grad_norm_local": "local_grad_norm"}
    values = {f: np.full((len(steps), len(ranks)), np.nan) for f in fields.values()}
    for r in recs:
        for src, dst in fields.items():
            values[dst][r["step"] - steps[0], r["rank"]] = r[src]
    return StepBlock(steps=np.array(steps), ranks=np.array(ranks), values=values,
                     present={f: np.isfinite(v) for f, v in values.items()})


def test_a_real_replica_bit_flip_that_jumps_and_stays_above_its_peers_is_named():
    # 4 gloo ranks; x256 on one element of the space's embedding row in rank 3's replica after the
    # update of step 600: its loss 1.34x its peers' at 601 (3.9 of its own sds: below jump_z, so
    # not the jump path), ~1.28x for 20 steps, then 1.16x, 1.14x and 1.08x for good. Found by the
    # weighted mean, rank 3 alone, 22 steps after the flip; critical once it lasted.
    from healthsvc_detectors.offline.rollback.decision import decide_rollback
    from healthsvc_detectors.offline.rollback.records import Checkpoint
    block = _recorded("sdc_burst_embed_s1337_r3")
    found = feed(RankOutlierDetector(), block, size=16)
    assert summary(found) == [("loss", 622, "warning", "firing", (3,), 608),
                              ("loss", 921, "critical", "firing", (3,), 608)]
    # The rollback answer finds the jump in rank 3's loss against its peers' (601, the first loss
    # of the corrupted replica), takes the abrupt window, and resumes from the newest clean
    # checkpoint: 500 (600 holds the flipped update).
    decision = decide_rollback(block, found, [Checkpoint(step=s) for s in range(100, 1_001, 100)])
    assert [(e["onset"], e["window"], e["jump_step"]) for e in decision.evidence["episodes"] if e["evidence"]] == \
        [(608, "abrupt", 601)]
    assert decision.checkpoint.step == 500


def test_a_real_replica_bit_flip_within_the_noise_is_not_seen():
    # x16 on one output-head weight of rank 3's replica at 600: its loss 1.08x and 1.14x its
    # peers' for two steps, then 1.008x against a per-step log sd of 0.099. Nothing statistical
    # can see it (only replica fingerprints would); nothing is named.
    assert feed(RankOutlierDetector(), _recorded("sdc_silent_head_s1337_r3"), size=16) == []
