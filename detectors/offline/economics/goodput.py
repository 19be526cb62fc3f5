"""Goodput: how much of a run's wall time became progress that survives.

Wall time (first attempt's start to last attempt's end) is split into:

- ``productive_s`` — steps in the run's effective history (the part of each attempt no later
  attempt redid) × that attempt's step time;
- ``checkpoint_s`` — the sum of checkpoint write durations;
- ``downtime_s`` — gaps between one attempt's end and the next one's start (restarts);
- ``recompute_s`` — steps an attempt computed that a later attempt computed again because it
  resumed from an earlier checkpoint (progress lost since the last checkpoint);
- ``corrupted_progress_s`` — the part of those thrown-away steps computed at or after the onset
  of a silent corruption that was detected later: progress made between a corruption's onset
  and its detection, which the rollback throws away;
- ``unaccounted_s`` — the residual (idle, input stalls, and the noise of using a typical step
  time); it can be slightly negative.

A step of attempt *i* survives if it is below the first step of every later attempt. A thrown-away
step counts as corrupted when some corruption has ``onset_step`` ≤ step and was detected after
the attempt started (the step ran on weights that were already bad). Step times are each
attempt's ``step_time_s`` (assumed to exclude checkpoint writes); when missing, the attempt's
duration over its step count.

Example: two attempts, the second resumed from the checkpoint at step 49 after a crash at 79.
    >>> g = compute_goodput([Attempt(0, 0.0, 80.0, 0, 79, step_time_s=1.0),
    ...                      Attempt(1, 100.0, 150.0, 50, 99, step_time_s=1.0)])
    >>> g.productive_s, g.recompute_s, g.downtime_s, round(g.goodput_fraction, 3)
    (100.0, 30.0, 20.0, 0.667)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from healthsvc_detectors.offline.economics.records import Attempt, CheckpointWrite, Corruption


@dataclass(frozen=True)
class Goodput:
    """Wall time split by use, in seconds; steps counted alongside."""

    wall_s: float
    productive_s: float
    checkpoint_s: float
    downtime_s: float
    recompute_s: float
    corrupted_progress_s: float
    unaccounted_s: float
    productive_steps: int
    recomputed_steps: int
    corrupted_steps: int

    @property
    def goodput_fraction(self) -> float:
        """productive_s / wall_s in [0, 1]; 0.0 for an empty run."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "productive_s": self.productive_s,
                "checkpoint_s": self.checkpoint_s, "downtime_s": self.downtime_s,
                "recompute_s": self.recompute_s,
                "corrupted_progress_s": self.corrupted_progress_s,
                "unaccounted_s": self.unaccounted_s, "goodput_fraction": self.goodput_fraction,
                "productive_steps": self.productive_steps,
                "recomputed_steps": self.recomputed_steps, "corrupted_steps": self.corrupted_steps}


def _step_time_s(a: Attempt) -> float:
    if a.step_time_s is not None:
        return float(a.step_time_s)
    return (a.end_s - a.start_s) / a.steps if a.steps else 0.0


def compute_goodput(attempts: Sequence[Attempt], checkpoints: Sequence[CheckpointWrite] = (),
                    corruptions: Sequence[Corruption] = ()) -> Goodput:
    """Split the run's wall time; see the module docstring for each term."""
    order = sorted(attempts, key=lambda a: (a.start_s, a.index))
    if not order:
        return Goodput(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0)
    wall_s = max(a.end_s for a in order) - order[0].start_s
    downtime_s = sum(max(0.0, b.start_s - a.end_s) for a, b in zip(order, order[1:]))
    checkpoint_s = sum(c.duration_s for c in checkpoints if c.duration_s is not None)

    productive_steps = recomputed_steps = corrupted_steps = 0
    productive_s = recompute_s = corrupted_s = 0.0
    # cut[i]: the lowest first step of any later attempt; steps >= cut were computed again.
    cut = float("inf")
    for a in reversed(order):
        step_s = _step_time_s(a)
        survive_last = min(a.last_step, cut - 1)
        kept = max(0, int(survive_last) - a.first_step + 1)
        lost_first = max(a.first_step, cut)
        lost = max(0, a.last_step - int(lost_first) + 1) if lost_first <= a.last_step else 0
        onsets = [c.onset_step for c in corruptions if c.detected_at_s >= a.start_s]
        bad = 0
        if lost and onsets:
            bad_first = max(int(lost_first), min(onsets))
            bad = max(0, a.last_step - bad_first + 1)
        productive_steps += kept
        recomputed_steps += lost - bad
        corrupted_steps += bad
        productive_s += kept * step_s
        recompute_s += (lost - bad) * step_s
        corrupted_s += bad * step_s
        cut = min(cut, a.first_step)
    unaccounted_s = wall_s - (productive_s + checkpoint_s + downtime_s + recompute_s + corrupted_s)
    return Goodput(wall_s=wall_s, productive_s=productive_s, checkpoint_s=checkpoint_s,
                   downtime_s=downtime_s, recompute_s=recompute_s,
                   corrupted_progress_s=corrupted_s, unaccounted_s=unaccounted_s,
                   productive_steps=productive_steps, recomputed_steps=recomputed_steps,
                   corrupted_steps=corrupted_steps)
