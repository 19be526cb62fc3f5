"""The exact checks, pinned: ``replica_mismatch`` (digests of replicas that must be identical) and
``resume_mismatch`` (a restart that does not continue the data position or the schedule), and the
rollback that the replicas' digests prove clean."""
from __future__ import annotations

import numpy as np
import pytest

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.replica import ReplicaMismatchDetector
from healthsvc_detectors.resume import ResumeMismatchDetector
from healthsvc_detectors.offline.rollback import Checkpoint, decide_rollback

RANKS = np.arange(8)


def digests(n_steps: int, every: int, odd: dict[int, int]) -> StepBlock:
    """Fingerprints every ``every`` steps (step s reports at s % every == every - 1); rank r's
    replica diverges from step ``odd[r]`` on (its digest differs from then on)."""
    steps = np.arange(n_steps)
    codes = np.tile((steps * 1000.0)[:, None], (1, len(RANKS)))
    for rank, since in odd.items():
        codes[steps >= since, rank] += 1 + rank
    present = np.zeros(codes.shape, bool)
    present[steps % every == every - 1] = True
    return StepBlock(steps=steps, ranks=RANKS, values={"param_digest": codes},
                     present={"param_digest": present})


def feed(det, block: StepBlock, size: int) -> list:
    return [f for start in range(0, block.n_steps, size)
            for f in det.update(block.slice_steps(start, start + size))]


@pytest.mark.parametrize("size", [1, 7, 16, 200])
def test_a_flipped_replica_is_named_at_the_first_fingerprint_after_it(size):
    found = feed(ReplicaMismatchDetector(), digests(200, 10, {5: 133}), size)
    assert [(f.step, f.ranks, f.severity, f.onset_step) for f in found] == [(139, (5,), "critical", 130)]
    assert (found[0].evidence["last_agreeing_step"], found[0].evidence["first_disagreeing_step"]) == (129, 139)
    assert found[0].evidence["strict_majority"] is True


def test_a_clean_run_never_fires_and_nor_do_steps_without_digests():
    assert feed(ReplicaMismatchDetector(), digests(500, 5, {}), 16) == []
    assert ReplicaMismatchDetector().update(StepBlock.from_dense([1, 2], RANKS, loss=np.ones((2, 8)))) == []


def test_two_replicas_that_disagree_are_both_named():
    codes = np.array([[1.0, 1.0], [2.0, 3.0]])
    found = ReplicaMismatchDetector().update(StepBlock.from_dense([9, 19], [0, 1], param_digest=codes))
    assert [(f.step, f.ranks, f.evidence["last_agreeing_step"]) for f in found] == [(19, (0, 1), 9)]


def test_a_second_rank_that_diverges_later_is_named_at_its_own_step():
    found = feed(ReplicaMismatchDetector(), digests(100, 10, {2: 33, 6: 71}), 16)
    assert [(f.step, f.ranks, f.evidence["last_agreeing_step"]) for f in found] == [(39, (2,), 29), (79, (6,), 29)]


def test_groups_are_judged_apart():
    # Two shards (groups 0 and 1) hold different parameters: that is no mismatch.
    codes = np.array([[1.0, 1.0, 2.0, 2.0], [3.0, 3.0, 4.0, 5.0]])
    groups = np.array([[0, 0, 1, 1], [0, 0, 1, 1]], dtype=float)
    found = ReplicaMismatchDetector().update(
        StepBlock.from_dense([4, 9], [0, 1, 2, 3], param_digest=codes, replica_group=groups))
    assert [(f.step, f.ranks, f.evidence["replica_group"]) for f in found] == [(9, (2, 3), 1)]


def partial(steps, ranks, codes, present) -> StepBlock:
    return StepBlock(steps=np.array(steps), ranks=np.array(ranks), values={"param_digest": np.array(codes, float)},
                     present={"param_digest": np.array(present, bool)})


def test_a_row_without_every_member_is_not_judged():
    det = ReplicaMismatchDetector()
    # Rows 9 and 19: all four agree. Row 29: only ranks 0 and 2, and they differ (rank 2's replica
    # flipped; ranks 1 and 3 did not report): no one is named, nothing proven.
    assert det.update(partial([9, 19, 29], [0, 1, 2, 3],
                              [[1, 1, 1, 1], [2, 2, 2, 2], [3, 0, 9, 0]],
                              [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 0]])) == []
    # Row 39, whole: rank 2 is named, and the proof reaches back to the last whole agreement (19).
    found = det.update(partial([39], [0, 1, 2, 3], [[4, 4, 8, 4]], [[1, 1, 1, 1]]))
    assert [(f.step, f.ranks, f.evidence["last_agreeing_step"]) for f in found] == [(39, (2,), 19)]
    # A partial row that agrees (rank 2 missing) neither resolves it nor moves the proof.
    assert det.update(partial([49], [0, 1, 2, 3], [[5, 5, 0, 5]], [[1, 1, 0, 1]])) == []
    assert det.state_dict()["last_agree"] == {"0": 19}
    [resolved] = det.update(partial([59], [0, 1, 2, 3], [[6, 6, 6, 6]], [[1, 1, 1, 1]]))
    assert (resolved.step, resolved.status) == (59, "resolved")


def test_a_partial_row_of_a_replica_group_is_skipped_and_the_other_group_judged():
    codes = [[1, 1, 1, 2, 2], [3, 0, 6, 4, 5]]
    present = [[1, 1, 1, 1, 1], [1, 0, 1, 1, 1]]     # group 0 misses rank 1 at step 9
    groups = np.array([[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]], float)
    block = partial([4, 9], [0, 1, 2, 3, 4], codes, present)
    block.values["replica_group"], block.present["replica_group"] = groups, np.ones((2, 5), bool)
    found = ReplicaMismatchDetector().update(block)
    assert [(f.step, f.ranks, f.evidence["replica_group"]) for f in found] == [(9, (3, 4), 1)]


def test_a_rank_that_reports_later_joins_the_group_and_members_survive_a_restore():
    det = ReplicaMismatchDetector()
    assert det.update(partial([9], [0, 1, 2], [[1, 1, 1]], [[1, 1, 1]])) == []
    assert det.update(partial([19], [0, 1, 2, 3], [[2, 2, 2, 2]], [[1, 1, 1, 1]])) == []
    again = ReplicaMismatchDetector()
    again.load_state_dict(det.state_dict())
    assert again.update(partial([29], [0, 1, 2, 3], [[3, 3, 7, 0]], [[1, 1, 1, 0]])) == []   # rank 3 missing
    det.new_attempt()   # a restart names the members again, from its first row
    assert [f.ranks for f in det.update(partial([29], [0, 1, 2, 3], [[3, 3, 7, 0]], [[1, 1, 1, 0]]))] == [(2,)]


def test_state_round_trips_mid_incident():
    block = digests(100, 10, {3: 41})
    det = ReplicaMismatchDetector()
    det.update(block.slice_steps(0, 45))
    again = ReplicaMismatchDetector()
    again.load_state_dict(det.state_dict())
    assert [(f.step, f.evidence["last_agreeing_step"]) for f in again.update(block.slice_steps(45, 100))] == [(49, 39)]


# ------------------------------------------------------------------------------ resume_mismatch

BATCH = 8


def attempt(first: int, last: int, *, cursor0: float | None = None, lr=lambda s: 1e-3 * (1 - s / 1000)):
    """Steps first..last of 4 ranks: the cursor counts samples (BATCH per step), the lr decays
    linearly; ``cursor0`` restarts the cursor (a sampler reset)."""
    steps = np.arange(first, last + 1)
    base = (steps + 1) * BATCH if cursor0 is None else cursor0 + (steps - first + 1) * BATCH
    cursor = np.tile(base[:, None].astype(float), (1, 4))
    rate = np.tile(np.array([lr(s) for s in steps])[:, None], (1, 4))
    return StepBlock.from_dense(steps, np.arange(4), data_cursor=cursor, lr=rate)


def resumed(first_run_last: int, resume_from: int, **kwargs) -> list:
    det = ResumeMismatchDetector()
    assert feed(det, attempt(0, first_run_last), 16) == []
    det.new_attempt()
    return feed(det, attempt(resume_from + 1, resume_from + 40, **kwargs), 16)


def test_an_honest_resume_raises_nothing_with_or_without_the_abandoned_steps():
    assert resumed(120, 99) == []       # the abandoned attempt reached 100.. : compared with it
    assert resumed(99, 99) == []        # it stopped at the checkpoint: compared with the trend


def test_a_sampler_reset_is_named_at_the_first_step_after_the_resume():
    found = resumed(120, 99, cursor0=0.0)
    assert [(f.step, f.metric, f.severity) for f in found] == [(100, "data_cursor", "critical")]
    assert (found[0].evidence["expected"], found[0].evidence["got"]) == (808.0, 8.0)
    assert found[0].evidence["reference"] == "abandoned_attempt" and found[0].evidence["resumed_from_step"] == 99


def test_a_scheduler_reset_is_named_against_the_trend_when_the_abandoned_attempt_stopped_at_the_checkpoint():
    found = resumed(99, 99, lr=lambda s: 1e-3 * (1 - (s - 100) / 1000))
    assert [(f.step, f.metric, f.evidence["reference"]) for f in found] == [(100, "lr", "trend")]
    assert found[0].evidence["expected"] == pytest.approx(1e-3 * 0.9) and found[0].evidence["got"] == pytest.approx(1e-3)


def test_no_resume_no_check():
    det = ResumeMismatchDetector()
    assert feed(det, attempt(0, 300), 16) == []
    again = ResumeMismatchDetector()
    again.load_state_dict(det.state_dict())
    again.new_attempt()
    assert [f.step for f in again.update(attempt(201, 210, cursor0=0.0))] == [201]


# ------------------------------------------------------------------------------------ rollback

def test_the_replicas_digests_prove_the_checkpoint_before_the_last_agreement_clean():
    found = feed(ReplicaMismatchDetector(), digests(200, 10, {5: 133}), 16)
    ckpts = [Checkpoint(s, f"mem://{s}") for s in (49, 99, 119, 129, 149, 199)]
    d = decide_rollback(None, found, ckpts)
    assert d.checkpoint.step == 129 and d.evidence["proven_clean"] is True
    assert (d.onset.low, d.onset.high, d.onset.confidence) == (130, 139, 1.0)
    assert d.evidence["proof"] == {"last_agreeing_step": 129, "first_disagreeing_step": 139, "ranks": [5]}
    assert d.evidence["origin"] == "hardware" and d.evidence["ranks"] == [5]
    assert "clean by proof" in d.reason and not d.conservative


def test_a_resume_mismatch_points_at_the_restore():
    found = resumed(120, 99, cursor0=0.0)
    from healthsvc_detectors.offline.rollback import Restart
    d = decide_rollback(None, found, [Checkpoint(49, "a"), Checkpoint(99, "b")], restarts=[Restart(100, 99)])
    assert d.checkpoint.step == 99 and d.evidence["resumed_from"] == 99


def test_reordering_the_ranks_changes_nothing():
    block = digests(100, 10, {5: 33})
    order = np.random.default_rng(3).permutation(len(RANKS))
    plain = [(f.step, f.ranks) for f in ReplicaMismatchDetector().update(block)]
    shuffled = [(f.step, f.ranks) for f in ReplicaMismatchDetector().update(block.take_ranks(order))]
    assert plain == shuffled == [(39, (5,))]


def test_a_sampler_reset_without_a_new_attempt_is_seen_as_the_cursor_going_back():
    # The abandoned attempt stopped at the checkpoint (step 99): the resumed steps repeat none,
    # so the service opens no attempt; the cursor going back says the sampler started again.
    det = ResumeMismatchDetector()
    found = feed(det, attempt(0, 99), 16) + feed(det, attempt(100, 140, cursor0=0.0), 16)
    assert [(f.step, f.metric, f.evidence["reference"], f.evidence["expected"], f.evidence["got"])
            for f in found] == [(100, "data_cursor", "previous_step", 808.0, 8.0)]
