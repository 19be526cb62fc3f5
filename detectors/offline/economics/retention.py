"""Which checkpoints to keep and which may be deleted: a plan, never a deletion.

The plan keeps recent checkpoints densely and older ones sparsely (ages growing geometrically),
within a storage budget (a count and/or bytes). Three guarantees come first and are kept even
when they break the budget — **guarantees win over the budget**, and the plan then says
``over_budget=True``:

1. ``rollback_target`` — the checkpoint the service named as the rollback target of every
   corruption detected so far (the newest one at that step written before the detection);
2. ``newest_verified_clean`` — the newest checkpoint a probe confirmed clean;
3. ``lag_coverage`` — a corruption that began just now would be detected only after a lag. The
   longest lag seen (detection step − onset step), times ``lag_margin_factor`` (and at least
   ``min_lag_window_steps``), is the *lag window* W. A rollback past a corruption that began at
   ``current_step − W`` needs a checkpoint with step < ``current_step − W`` (a checkpoint at c
   is clean only if c < onset), so the newest such checkpoint is kept; when no checkpoint is that
   old, the oldest one is kept (``lag_coverage_oldest_available``).

Then, while the budget allows: the ``keep_recent`` newest (``recent``), then one checkpoint per
geometric age bucket, younger buckets first (``sparse_spacing``). A checkpoint written before a
corruption was detected whose step is at or after its onset holds corrupted updates: it is not
a candidate (``known_corrupted``) unless a guarantee names it; so is one marked ``known_bad``.

Example:
    >>> ckpts = [CheckpointWrite(step=s, uri=f"c{s}", written_at_s=float(s), size_bytes=10)
    ...          for s in range(100, 1100, 100)]
    >>> plan = plan_retention(ckpts, current_step=1050,
    ...                       policy=RetentionPolicy(keep_recent=2, max_count=6))
    >>> [d.checkpoint.step for d in plan.decisions if d.keep]
    [100, 300, 700, 800, 900, 1000]
    >>> plan.decisions[1].reasons, plan.decisions[-1].reasons
    (('thinned',), ('lag_coverage',))
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from healthsvc_detectors.offline.economics.records import CheckpointWrite, Corruption

GUARANTEE_REASONS: tuple[str, ...] = (
    "rollback_target", "newest_verified_clean", "lag_coverage", "lag_coverage_oldest_available")


@dataclass(frozen=True)
class RetentionPolicy:
    """How densely to keep checkpoints and how much storage they may use.

    ``keep_recent``: newest checkpoints kept densely. ``sparse_base``: older checkpoints are kept
    one per age bucket [u·b^k, u·b^(k+1)) steps, u = ``sparse_unit_steps`` (default: the median
    gap between checkpoints). ``max_count`` / ``max_bytes``: the budget (None = unlimited).
    ``lag_margin_factor`` / ``min_lag_window_steps``: the lag window, see the module docstring.
    """

    keep_recent: int = 3
    sparse_base: float = 2.0
    sparse_unit_steps: int | None = None
    max_count: int | None = None
    max_bytes: int | None = None
    lag_margin_factor: float = 1.5
    min_lag_window_steps: int = 0

    def __post_init__(self) -> None:
        if self.keep_recent < 0:
            raise ValueError("keep_recent must be >= 0")
        if not self.sparse_base > 1:
            raise ValueError("sparse_base must be > 1 (ages grow by this factor per bucket)")
        if self.sparse_unit_steps is not None and self.sparse_unit_steps <= 0:
            raise ValueError("sparse_unit_steps must be > 0")
        if self.max_count is not None and self.max_count < 0:
            raise ValueError("max_count must be >= 0")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if self.lag_margin_factor < 1:
            raise ValueError("lag_margin_factor must be >= 1 (a margin never shrinks the lag)")
        if self.min_lag_window_steps < 0:
            raise ValueError("min_lag_window_steps must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return {"keep_recent": self.keep_recent, "sparse_base": self.sparse_base,
                "sparse_unit_steps": self.sparse_unit_steps, "max_count": self.max_count,
                "max_bytes": self.max_bytes, "lag_margin_factor": self.lag_margin_factor,
                "min_lag_window_steps": self.min_lag_window_steps}


@dataclass(frozen=True)
class RetentionDecision:
    checkpoint: CheckpointWrite
    keep: bool
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.checkpoint.step, "uri": self.checkpoint.uri,
                "size_bytes": self.checkpoint.size_bytes,
                "written_at_s": self.checkpoint.written_at_s,
                "action": "keep" if self.keep else "delete", "reasons": list(self.reasons)}


@dataclass(frozen=True)
class RetentionPlan:
    """One decision per checkpoint, in write order (oldest first)."""

    decisions: tuple[RetentionDecision, ...]
    policy: RetentionPolicy
    current_step: int
    lag_window_steps: int
    kept_count: int
    kept_bytes: int
    deletable_bytes: int
    over_budget: bool

    @property
    def kept(self) -> tuple[CheckpointWrite, ...]:
        return tuple(d.checkpoint for d in self.decisions if d.keep)

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.to_dict(), "current_step": self.current_step,
                "lag_window_steps": self.lag_window_steps, "kept_count": self.kept_count,
                "kept_bytes": self.kept_bytes, "deletable_bytes": self.deletable_bytes,
                "over_budget": self.over_budget,
                "checkpoints": [d.to_dict() for d in self.decisions]}


def lag_window_steps(corruptions: Sequence[Corruption], policy: RetentionPolicy) -> int:
    """Steps of history needed to roll back past a corruption not detected yet."""
    longest = max((c.lag_steps for c in corruptions), default=0)
    return max(policy.min_lag_window_steps, math.ceil(policy.lag_margin_factor * longest))


def _is_corrupted(ckpt: CheckpointWrite, corruptions: Sequence[Corruption]) -> bool:
    return ckpt.known_bad or any(ckpt.written_at_s <= c.detected_at_s and ckpt.step >= c.onset_step
               for c in corruptions)


def _rollback_targets(order: Sequence[CheckpointWrite], corruptions: Sequence[Corruption]) -> set[int]:
    """Indices (into ``order``) of the rollback target of each corruption."""
    targets: set[int] = set()
    for corr in corruptions:
        if corr.rollback_target_step is None:
            continue
        matches = [i for i, c in enumerate(order) if c.step == corr.rollback_target_step]
        before = [i for i in matches if order[i].written_at_s <= corr.detected_at_s]
        if before or matches:
            targets.add(max(before or matches, key=lambda i: order[i].written_at_s))
    return targets


def _sparse_picks(order: Sequence[CheckpointWrite], candidates: Sequence[int], current_step: int,
                  policy: RetentionPolicy) -> list[int]:
    """One index per geometric age bucket (the oldest in it), younger buckets first."""
    if not candidates:
        return []
    unit = policy.sparse_unit_steps
    if unit is None:
        steps = sorted({order[i].step for i in range(len(order))})
        gaps = [b - a for a, b in zip(steps, steps[1:])]
        unit = max(1, int(statistics.median(gaps))) if gaps else 1
    buckets: dict[int, int] = {}
    for i in candidates:
        age = max(unit, current_step - order[i].step)
        bucket = int(math.floor(math.log(age / unit, policy.sparse_base) + 1e-12))
        if bucket not in buckets or order[i].step < order[buckets[bucket]].step:
            buckets[bucket] = i
    return [buckets[b] for b in sorted(buckets)]


def plan_retention(checkpoints: Sequence[CheckpointWrite], *, current_step: int,
                   corruptions: Sequence[Corruption] = (),
                   policy: RetentionPolicy = RetentionPolicy()) -> RetentionPlan:
    """Keep/delete with reasons for every checkpoint; see the module docstring for the rules."""
    order = sorted(checkpoints, key=lambda c: (c.written_at_s, c.step))
    n = len(order)
    reasons: list[list[str]] = [[] for _ in range(n)]
    corrupted = [_is_corrupted(c, corruptions) for c in order]
    clean = [i for i in range(n) if not corrupted[i]]

    for i in _rollback_targets(order, corruptions):
        reasons[i].append("rollback_target")
    verified = [i for i in clean if order[i].verified_clean]
    if verified:
        reasons[max(verified, key=lambda i: order[i].written_at_s)].append("newest_verified_clean")
    window = lag_window_steps(corruptions, policy)
    old_enough = [i for i in clean if order[i].step < current_step - window]
    if old_enough:
        reasons[max(old_enough, key=lambda i: (order[i].step, order[i].written_at_s))].append("lag_coverage")
    elif clean:
        reasons[min(clean, key=lambda i: (order[i].step, order[i].written_at_s))].append(
            "lag_coverage_oldest_available")
    guaranteed = {i for i in range(n) if reasons[i]}

    known_sizes = [c.size_bytes for c in order if c.size_bytes is not None]
    # An unknown size is budgeted as the typical known one, so it cannot slip through for free.
    typical_size = int(statistics.median(known_sizes)) if known_sizes else 0

    def size(i: int) -> int:
        known = order[i].size_bytes
        return known if known is not None else typical_size

    kept = set(guaranteed)
    kept_bytes = sum(size(i) for i in kept)
    over_budget = ((policy.max_count is not None and len(kept) > policy.max_count)
                   or (policy.max_bytes is not None and kept_bytes > policy.max_bytes))

    optional = [i for i in reversed(clean) if i not in guaranteed]
    recent = optional[:policy.keep_recent]
    sparse = _sparse_picks(order, optional[policy.keep_recent:], current_step, policy)
    for i, why in [(i, "recent") for i in recent] + [(i, "sparse_spacing") for i in sparse]:
        fits_count = policy.max_count is None or len(kept) + 1 <= policy.max_count
        fits_bytes = policy.max_bytes is None or kept_bytes + size(i) <= policy.max_bytes
        if fits_count and fits_bytes:
            kept.add(i)
            kept_bytes += size(i)
            reasons[i].append(why)
        else:
            reasons[i].append("over_budget")

    for i in range(n):
        if not reasons[i]:
            reasons[i].append("known_corrupted" if corrupted[i] else "thinned")
        elif corrupted[i] and i in guaranteed:
            reasons[i].append("known_corrupted")
    decisions = tuple(RetentionDecision(order[i], i in kept, tuple(reasons[i])) for i in range(n))
    return RetentionPlan(
        decisions=decisions, policy=policy, current_step=current_step, lag_window_steps=window,
        kept_count=len(kept), kept_bytes=kept_bytes,
        deletable_bytes=sum(size(i) for i in range(n) if i not in kept), over_budget=over_budget)
