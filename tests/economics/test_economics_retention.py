"""Retention plan: the guarantees as properties, the budget, and a worked corruption case."""
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from healthsvc_detectors.offline.economics.records import CheckpointWrite, Corruption
from healthsvc_detectors.offline.economics.retention import (GUARANTEE_REASONS, RetentionPolicy, lag_window_steps,
                                                   plan_retention)


@st.composite
def run_histories(draw):
    """Checkpoints in write order (steps may repeat after a rollback), corruptions detected so far
    with their rollback targets, the current step, and a policy."""
    n = draw(st.integers(0, 20))
    ckpts, step, t = [], 0, 0.0
    for k in range(n):
        if ckpts and draw(st.integers(0, 9)) == 0:   # a rollback: steps go back
            step = max(0, step - draw(st.integers(1, 600)))
        step += draw(st.integers(1, 300))
        t += draw(st.floats(1.0, 500.0))
        ckpts.append(CheckpointWrite(step=step, uri=f"ckpt-{k}", written_at_s=t,
                                     size_bytes=draw(st.integers(1, 100)),
                                     verified_clean=draw(st.booleans())))
    current_step = step + draw(st.integers(0, 500))
    corruptions = []
    for _ in range(draw(st.integers(0, 3)) if ckpts else 0):
        onset = draw(st.integers(0, current_step))
        lag = draw(st.integers(0, 800))
        earlier = [c.step for c in ckpts if c.step < onset]
        target = draw(st.sampled_from(earlier)) if earlier and draw(st.booleans()) else None
        corruptions.append(Corruption(onset_step=onset, detected_step=onset + lag,
                                      detected_at_s=draw(st.floats(0.0, t + 100.0)),
                                      rollback_target_step=target))
    policy = RetentionPolicy(
        keep_recent=draw(st.integers(0, 5)), sparse_base=draw(st.sampled_from([1.5, 2.0, 4.0])),
        max_count=draw(st.none() | st.integers(0, 12)),
        max_bytes=draw(st.none() | st.integers(0, 800)),
        lag_margin_factor=draw(st.sampled_from([1.0, 1.5, 3.0])),
        min_lag_window_steps=draw(st.sampled_from([0, 100])))
    return ckpts, corruptions, current_step, policy


def _corrupted(ckpt, corruptions):
    return any(ckpt.written_at_s <= c.detected_at_s and ckpt.step >= c.onset_step for c in corruptions)


@settings(max_examples=150, deadline=None)
@given(run_histories())
def test_every_checkpoint_gets_exactly_one_decision_with_a_reason(history):
    ckpts, corruptions, current, policy = history
    plan = plan_retention(ckpts, current_step=current, corruptions=corruptions, policy=policy)
    assert sorted(d.checkpoint.uri for d in plan.decisions) == sorted(c.uri for c in ckpts)
    assert all(d.reasons for d in plan.decisions)
    assert plan.kept_count == sum(d.keep for d in plan.decisions)
    json.dumps(plan.to_dict())


@settings(max_examples=150, deadline=None)
@given(run_histories())
def test_rollback_target_of_every_detected_corruption_is_kept(history):
    ckpts, corruptions, current, policy = history
    plan = plan_retention(ckpts, current_step=current, corruptions=corruptions, policy=policy)
    kept = plan.kept
    for corr in corruptions:
        if corr.rollback_target_step is None:
            continue
        candidates = [c for c in ckpts if c.step == corr.rollback_target_step]
        before = [c for c in candidates if c.written_at_s <= corr.detected_at_s]
        target = max(before or candidates, key=lambda c: c.written_at_s)
        assert target in kept


@settings(max_examples=150, deadline=None)
@given(run_histories())
def test_newest_verified_clean_checkpoint_is_kept(history):
    ckpts, corruptions, current, policy = history
    plan = plan_retention(ckpts, current_step=current, corruptions=corruptions, policy=policy)
    verified = [c for c in ckpts if c.verified_clean and not _corrupted(c, corruptions)]
    if verified:
        assert max(verified, key=lambda c: c.written_at_s) in plan.kept


@settings(max_examples=150, deadline=None)
@given(run_histories())
def test_kept_history_covers_the_longest_detection_lag_with_margin(history):
    ckpts, corruptions, current, policy = history
    plan = plan_retention(ckpts, current_step=current, corruptions=corruptions, policy=policy)
    longest = max((c.detected_step - c.onset_step for c in corruptions), default=0)
    window = plan.lag_window_steps
    assert window >= policy.lag_margin_factor * longest and window >= policy.min_lag_window_steps
    clean = [c for c in ckpts if not _corrupted(c, corruptions)]
    old_enough = [c for c in clean if c.step < current - window]
    kept_steps = {c.step for c in plan.kept}
    if old_enough:
        # the newest checkpoint that predates any onset inside the window is kept
        assert max(c.step for c in old_enough) in kept_steps
    elif clean:
        assert min(c.step for c in clean) in kept_steps


@settings(max_examples=150, deadline=None)
@given(run_histories())
def test_budget_is_respected_unless_the_guarantees_alone_exceed_it(history):
    ckpts, corruptions, current, policy = history
    plan = plan_retention(ckpts, current_step=current, corruptions=corruptions, policy=policy)
    guaranteed = [d for d in plan.decisions if set(d.reasons) & set(GUARANTEE_REASONS)]
    g_bytes = sum(d.checkpoint.size_bytes for d in guaranteed)
    fits = ((policy.max_count is None or len(guaranteed) <= policy.max_count)
            and (policy.max_bytes is None or g_bytes <= policy.max_bytes))
    assert all(d.keep for d in guaranteed)
    if fits:
        assert not plan.over_budget
        assert policy.max_count is None or plan.kept_count <= policy.max_count
        assert policy.max_bytes is None or plan.kept_bytes <= policy.max_bytes
    else:
        # guarantees win: nothing beyond them is kept, and the plan says it is over budget
        assert plan.over_budget
        assert plan.kept_count == len(guaranteed)


@settings(max_examples=100, deadline=None)
@given(run_histories(), st.integers(0, 12))
def test_a_larger_count_budget_never_deletes_what_a_smaller_one_kept(history, extra):
    ckpts, corruptions, current, policy = history
    small = RetentionPolicy(keep_recent=policy.keep_recent, sparse_base=policy.sparse_base,
                            max_count=4, lag_margin_factor=policy.lag_margin_factor)
    large = RetentionPolicy(keep_recent=policy.keep_recent, sparse_base=policy.sparse_base,
                            max_count=4 + extra, lag_margin_factor=policy.lag_margin_factor)
    kept_small = set(plan_retention(ckpts, current_step=current, corruptions=corruptions,
                                    policy=small).kept)
    kept_large = set(plan_retention(ckpts, current_step=current, corruptions=corruptions,
                                    policy=large).kept)
    assert kept_small <= kept_large


def test_worked_case_corruption_detected_late_then_rolled_back():
    # First branch: checkpoints every 100 steps, written at t = step. Corruption began with the
    # update of step 650 and was detected at step 820 (t = 820); the service said "resume from
    # 600". The second branch re-wrote 700 and 800 at t = 900 and 1000; now at step 850.
    first = [CheckpointWrite(step=s, uri=f"a/{s}", written_at_s=float(s), size_bytes=10)
             for s in range(100, 900, 100)]
    second = [CheckpointWrite(step=700, uri="b/700", written_at_s=900.0, size_bytes=10),
              CheckpointWrite(step=800, uri="b/800", written_at_s=1000.0, size_bytes=10)]
    corruption = Corruption(onset_step=650, detected_step=820, detected_at_s=820.0,
                            rollback_target_step=600)
    policy = RetentionPolicy(keep_recent=2, max_count=5, lag_margin_factor=1.5)
    plan = plan_retention(first + second, current_step=850, corruptions=[corruption], policy=policy)
    by_uri = {d.checkpoint.uri: d for d in plan.decisions}
    # lag 170 steps * 1.5 = 255: a corruption starting at 850 - 255 = 595 needs a checkpoint < 595
    assert plan.lag_window_steps == 255
    assert by_uri["a/600"].keep and "rollback_target" in by_uri["a/600"].reasons
    assert by_uri["a/500"].keep and by_uri["a/500"].reasons == ("lag_coverage",)
    assert by_uri["b/800"].reasons == ("recent",) and by_uri["b/700"].reasons == ("recent",)
    for uri in ("a/700", "a/800"):  # written before detection, at or after the onset
        assert not by_uri[uri].keep and by_uri[uri].reasons == ("known_corrupted",)
    # One slot left: a/400..a/100 have ages 450..750 steps, in units of the median gap (100)
    # 4.5..7.5 -> all in log2 bucket 2 [4, 8); its oldest member, a/100, takes the slot.
    assert by_uri["a/100"].keep and by_uri["a/100"].reasons == ("sparse_spacing",)
    for uri in ("a/200", "a/300", "a/400"):
        assert not by_uri[uri].keep and by_uri[uri].reasons == ("thinned",)
    assert plan.kept_count == 5 and plan.kept_bytes == 50 and not plan.over_budget


def test_unlimited_budget_keeps_the_recent_ones_and_thins_the_rest():
    ckpts = [CheckpointWrite(step=s, uri=f"c{s}", written_at_s=float(s)) for s in range(100, 1600, 100)]
    plan = plan_retention(ckpts, current_step=1600, policy=RetentionPolicy(keep_recent=3))
    kept = sorted(c.step for c in plan.kept)
    # 1500: lag coverage (zero window: the newest below the current step); 1400/1300/1200
    # recent; the rest have ages 500..1500 steps, unit 100 -> log2 bucket 2 = ages [400, 800)
    # holds 1100..900, bucket 3 = [800, 1600) holds 800..100: the oldest of each, 900 and 100.
    assert kept == [100, 900, 1200, 1300, 1400, 1500]
    assert lag_window_steps([], RetentionPolicy(min_lag_window_steps=40)) == 40


def test_a_checkpoint_marked_bad_is_deletable_unless_a_guarantee_names_it():
    ckpts = [CheckpointWrite(step=s, uri=f"c{s}", written_at_s=float(s), known_bad=(s == 300))
             for s in (100, 200, 300)]
    plan = plan_retention(ckpts, current_step=300, policy=RetentionPolicy(keep_recent=3))
    by_step = {d.checkpoint.step: d for d in plan.decisions}
    assert not by_step[300].keep and by_step[300].reasons == ("known_corrupted",)
    assert by_step[200].reasons == ("lag_coverage",) and by_step[100].reasons == ("recent",)
