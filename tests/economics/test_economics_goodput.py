"""Goodput against a constructed run whose every second is known."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthsvc_detectors.offline.economics.goodput import compute_goodput
from healthsvc_detectors.offline.economics.records import Attempt, CheckpointWrite, Corruption


def _ckpt(step, at_s, duration_s=10.0):
    return CheckpointWrite(step=step, uri=f"c/{step}@{at_s}", written_at_s=at_s, duration_s=duration_s)


def constructed_run():
    """Attempt 0: steps 0..999 at 1 s/step plus three 10 s checkpoints (249, 499, 749): 0..1030 s.
    Crash; 70 s down. Attempt 1 resumes from 749: steps 750..1799 at 1 s plus four checkpoints
    (999, 1249, 1499, 1749): 1100..2190 s. Corruption began with the update of 1500, detected at
    t = 2100; rollback to 1499 after 110 s down. Attempt 2 (fewer ranks, 2 s/step): steps
    1500..2499 plus four checkpoints: 2300..4340 s."""
    attempts = [Attempt(0, 0.0, 1030.0, 0, 999, step_time_s=1.0),
                Attempt(1, 1100.0, 2190.0, 750, 1799, step_time_s=1.0),
                Attempt(2, 2300.0, 4340.0, 1500, 2499, step_time_s=2.0)]
    ckpts = ([_ckpt(s, float(s)) for s in (249, 499, 749)]
             + [_ckpt(s, 1100.0 + s) for s in (999, 1249, 1499, 1749)]
             + [_ckpt(s, 2300.0 + s) for s in (1749, 1999, 2249, 2499)])
    corruption = Corruption(onset_step=1500, detected_step=1700, detected_at_s=2100.0,
                            rollback_target_step=1499)
    return attempts, ckpts, [corruption]


def test_goodput_of_the_constructed_run():
    g = compute_goodput(*constructed_run())
    assert g.wall_s == 4340.0
    assert g.checkpoint_s == 110.0                        # 11 writes * 10 s
    assert g.downtime_s == 180.0                          # 70 + 110
    # survivors: 0..749 (750 s), 750..1499 (750 s), 1500..2499 at 2 s (2000 s)
    assert (g.productive_steps, g.productive_s) == (2500, 3500.0)
    # attempt 0's 750..999 redone after the crash
    assert (g.recomputed_steps, g.recompute_s) == (250, 250.0)
    # attempt 1's 1500..1799 ran on corrupted weights and were thrown away by the rollback
    assert (g.corrupted_steps, g.corrupted_progress_s) == (300, 300.0)
    assert g.unaccounted_s == pytest.approx(0.0)
    assert g.goodput_fraction == pytest.approx(3500 / 4340)
    json.dumps(g.to_dict())


def test_without_the_corruption_the_same_throwaway_is_plain_recompute():
    attempts, ckpts, _ = constructed_run()
    g = compute_goodput(attempts, ckpts, corruptions=[])
    assert (g.recomputed_steps, g.corrupted_steps) == (550, 0)
    assert g.recompute_s == 550.0


def test_missing_step_time_falls_back_to_duration_per_step():
    g = compute_goodput([Attempt(0, 0.0, 200.0, 0, 99)])
    assert g.productive_s == 200.0 and g.goodput_fraction == 1.0
    assert compute_goodput([]).goodput_fraction == 0.0


@st.composite
def resumed_attempts(draw):
    attempts, start, first, t = [], 0, 0, 0.0
    for k in range(draw(st.integers(1, 6))):
        last = first + draw(st.integers(0, 400))
        step_s = draw(st.floats(0.5, 3.0))
        end = t + (last - first + 1) * step_s
        attempts.append(Attempt(k, t, end, first, last, step_time_s=step_s))
        t = end + draw(st.floats(0.0, 100.0))
        first = draw(st.integers(0, last + 1))  # resume from any checkpoint up to the last step
    return attempts


@settings(max_examples=150, deadline=None)
@given(resumed_attempts(), st.integers(0, 2000))
def test_every_computed_step_is_counted_once_and_the_final_history_is_productive(attempts, onset):
    corruption = Corruption(onset_step=onset, detected_step=onset, detected_at_s=attempts[-1].end_s)
    g = compute_goodput(attempts, corruptions=[corruption])
    computed = sum(a.last_step - a.first_step + 1 for a in attempts)
    assert g.productive_steps + g.recomputed_steps + g.corrupted_steps == computed
    assert g.productive_steps == attempts[-1].last_step + 1   # steps 0..last of the final history
    assert g.unaccounted_s == pytest.approx(0.0, abs=1e-6)     # attempts are back to back + gaps
    assert 0.0 <= g.goodput_fraction <= 1.0 + 1e-12
