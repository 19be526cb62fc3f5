"""Where did the corruption begin? An onset estimate from a run's history up to a detection.

The answer is the step ``s`` of the **first corrupted update**, with an interval ``[low, high]``
that should contain it, a confidence in [0, 1] and the signals it rests on. Semantics (DESIGN.md):
a loss reflects the weights *before* its step's update, so a corrupted update at ``s`` shows in
the gradient norm at ``s`` and in the loss from ``s + 1`` on. A change first seen in the loss at
step ``t`` therefore means ``s = t - 1`` (poisoned weights), or ``s = t`` when the batch itself was
bad (its own forward pass shows it): the point is ``t - 1``, the interval keeps both. A change first
seen in a gradient norm at ``t`` means ``s = t``.

Signals (each used when the history carries it; ``OnsetEstimate.per_signal`` keeps each one;
the extractors are in :mod:`healthsvc_detectors.offline.onset_signals`, this module combines them):

- ``non_finite``: the first NaN/Inf in the loss, the gradient norm or a rank's local gradient
  norm. An exact, abrupt onset; it bounds ``high`` even when an earlier drift caused it.
- ``loss_trend``: a change point in the log loss against its own earlier trend.
- ``grad_norm``: a change point in the log gradient norm (level shift or spike burst).
- ``rank_disagreement``: a change point in one rank's deviation from the cross-rank median of
  ``local_grad_norm`` (or per-rank ``loss``): the silent-corruption suspect of ``rank_outlier``.
- ``findings``: steps of the findings of this incident; the onset is no later than the earliest.

The change point model (per series ``y``, in log space; the machinery is in
:mod:`healthsvc_detectors.offline.changepoint`): a trend (quadratic in ``log(step)`` plus
linear in ``step``) plus
either a level shift (abrupt) or a hinge ``max(0, step - tau)`` (gradual, a drift), fitted by
least squares for *every* ``tau`` at once from suffix sums, so one fit costs O(n). The best
``tau`` maximises the likelihood ratio ``LR = (RSS_0 - RSS_tau) / sigma^2``; the change counts when
``LR > 2 ln n + significance`` and its effect at the last sample is at least
``min_excess_sigma`` noise units; the interval is every ``tau`` (of any shape) whose ``LR`` is
within ``interval_lr`` of the best. ``sigma^2`` is inflated by the AR(1) long-run factor
``(1 + rho) / (1 - rho)`` of the residuals, so runs of hard batches and a trend that does not quite
fit do not pass for changes. A one-sample pulse (a burst already over) is a third shape. The
analysis starts in a window near the detection and doubles it while the change is not significant
or has too little history before it; windows longer than ``max_points`` samples are averaged into
that many bins first. When a finding vouches for a change the history does not show clearly, the
likeliest change before the finding is *located* instead (score 0; the earliest over all windows,
which is the conservative choice). The whole estimate is
O(n log r) for n steps and r ranks: about 0.1 s for 1 M steps (see ``bench/onset.py``).

Combination is conservative: ``high`` is the smallest upper bound of any signal, ``low`` the
smallest lower bound, ``step`` the earliest point estimate (clipped into the interval) of the
signals the history shows (a merely located change widens the interval, it does not move the
point).

Near the evidence only: the rollback does not ask "where did this curve change?" but "where did the
incident that these findings vouch for begin?". :func:`estimate_onset_near` runs the estimate on
the history around the findings and ``search_from`` (the earliest update the evidence allows, see
:func:`healthsvc_detectors.offline.rollback.onset_window`) drops signals that end before it and clips the others, so
a change point of a clean, smoothly decaying curve against its own trend far from the evidence
cannot become the onset.

Example: a gradient burst on every rank at step 3000 of a noisy, decaying loss.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> steps = np.arange(1, 3101)
>>> loss = 3.0 * steps ** -0.1 * np.exp(rng.normal(0, 0.02, steps.size))
>>> grad = np.exp(rng.normal(0, 0.1, steps.size)); grad[steps >= 3000] *= 20
>>> loss[steps >= 3001] *= 1.5
>>> est = estimate_onset(steps, loss=loss, grad_norm=grad)
>>> est.step, est.low <= 3000 <= est.high, est.signals_used
(3000, True, ['loss_trend', 'grad_norm'])
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

import numpy as np

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.offline.onset_model import (ONSET_SIGNALS, RANK_METRICS, OnsetEstimate,
                                           OnsetParams, Origin, SignalEstimate)
from healthsvc_detectors.offline.onset_signals import (history_signals, non_finite_signal, row_median,
                                             warmup_end_from_lr)

__all__ = ["OnsetEstimate", "OnsetParams", "SignalEstimate", "estimate_onset",
           "estimate_onset_from_block", "estimate_onset_near", "warmup_end_from_lr"]


def estimate_onset(
    steps: Sequence[int] | np.ndarray,
    loss: np.ndarray | None = None,
    grad_norm: np.ndarray | None = None,
    *,
    per_rank: StepBlock | None = None,
    finding_steps: Iterable[int] = (),
    first_non_finite_step: int | None = None,
    warmup_end_step: int | None = None,
    search_from: int | None = None,
    params: OnsetParams = OnsetParams(),
) -> OnsetEstimate | None:
    """Estimate the first corrupted update from per-step history; None when nothing shows one.

    ``steps``: (n,) increasing step numbers; ``loss``: aggregate loss (say, the median over
    ranks); ``grad_norm``: the global gradient norm; NaN/Inf are data. ``per_rank``: an optional
    block with per-rank ``local_grad_norm`` and/or ``loss`` over (a suffix of) the same steps.
    ``finding_steps``: steps (or onset steps) of this incident's findings;
    ``first_non_finite_step``: when the caller already knows it. ``warmup_end_step``: the first
    step after the learning-rate warm-up; change points are searched only from there on (the
    warm-up's transients are no trend to compare with), non-finite values everywhere.
    ``search_from``: the earliest update the evidence allows (see :func:`estimate_onset_near`):
    a change the history shows before it is not this incident's and is clipped away, so a
    change point of a smooth curve against its own trend cannot drag the onset back.
    """
    steps = np.asarray(steps, dtype=np.int64)
    if steps.size == 0:
        return None
    if steps.size > 1 and np.any(np.diff(steps) <= 0):
        raise ValueError("steps must be strictly increasing (pass the run's effective history)")
    hints = sorted(int(h) for h in finding_steps)
    signals: dict[str, SignalEstimate] = {}

    non_finite = non_finite_signal(steps, loss, grad_norm, per_rank, first_non_finite_step)
    if non_finite is not None:
        signals["non_finite"] = non_finite
    anchors = hints + ([non_finite.step] if non_finite is not None else [])
    anchor = min(anchors) if anchors else None
    first_step = int(steps[0])
    if warmup_end_step is not None and warmup_end_step > steps[0]:
        cut = int(np.searchsorted(steps, warmup_end_step))
        steps, loss, grad_norm = steps[cut:], _tail(loss, cut), _tail(grad_norm, cut)
        if per_rank is not None:
            per_rank = per_rank.slice_steps(int(np.searchsorted(per_rank.steps, warmup_end_step)),
                                            per_rank.n_steps)
        # Evidence inside the warm-up still counts (the findings below), with no change points.
    signals.update(history_signals(steps, loss, grad_norm, per_rank, anchor, params))

    if hints:
        h = max(hints[0], first_step)
        # A change that starts only after the finding cannot be what the finding saw.
        for name in [k for k, sig in signals.items() if k != "non_finite" and sig.low > h]:
            del signals[name]
        if not any(sig.low <= h for sig in signals.values()):
            # The finding says a change exists, so locate the likeliest one up to the finding
            # without asking it to be significant on its own (scores stay 0).
            upto = int(np.searchsorted(steps, h, side="right"))
            located = history_signals(
                steps[:upto], _head(loss, upto), _head(grad_norm, upto),
                None if per_rank is None else _block_upto(per_rank, h), h,
                replace(params, significance=params.located_significance, min_excess_sigma=0.0),
                located=True)
            for name, sig in located.items():
                signals.setdefault(name, replace(
                    sig, score=0.0, detail={**sig.detail, "located_after_finding": True}))
        signals["findings"] = SignalEstimate(
            "findings", step=max(first_step, h - 1), low=max(first_step, h - 1), high=h,
            shape="abrupt", score=0.1, detail={"finding_steps": hints[:20]})
    if search_from is not None:
        signals = _clip_signals(signals, int(search_from))
    if not signals:
        return None
    return _combine(signals, steps, grad_norm, per_rank)


def _clip_signals(signals: dict[str, SignalEstimate], floor: int) -> dict[str, SignalEstimate]:
    """Signals that end before ``floor`` are dropped; the others start no earlier than it."""
    out = {}
    for name, sig in signals.items():
        if sig.high < floor:
            continue
        if sig.low < floor:
            sig = replace(sig, low=floor, step=max(sig.step, floor),
                          detail={**sig.detail, "clipped_low_from": sig.low})
        out[name] = sig
    return out


def _tail(values, n: int):
    return None if values is None else np.asarray(values, float)[n:]


def _head(values, n: int):
    return None if values is None else np.asarray(values, float)[:n]


def _block_upto(block: StepBlock, step: int) -> StepBlock:
    return block.slice_steps(0, int(np.searchsorted(block.steps, step, side="right")))


def estimate_onset_from_block(
    block: StepBlock,
    *,
    finding_steps: Iterable[int] = (),
    first_non_finite_step: int | None = None,
    warmup_end_step: int | None = None,
    search_from: int | None = None,
    params: OnsetParams = OnsetParams(),
) -> OnsetEstimate | None:
    """Same as :func:`estimate_onset` for a steps x ranks block of the run's history.

    When the block carries ``lr`` and ``warmup_end_step`` is not given, the warm-up's end is read
    from it (:func:`warmup_end_from_lr`).

    The aggregate loss is the median over the ranks that reported a finite loss at each step, the
    gradient norm the median of the reported global norms (they agree across ranks when healthy).
    """
    loss = row_median(block.values["loss"], block.present["loss"]) if block.has("loss") else None
    grad = (row_median(block.values["grad_norm"], block.present["grad_norm"])
            if block.has("grad_norm") else None)
    # A non-finite value on any rank makes the aggregate non-finite: NaN is data.
    for name, agg in (("loss", loss), ("grad_norm", grad)):
        if agg is not None:
            bad = (block.present[name] & ~np.isfinite(block.values[name])).any(axis=1)
            agg[bad] = np.nan
    if warmup_end_step is None and block.has("lr"):
        warmup_end_step = warmup_end_from_lr(block.steps,
                                             row_median(block.values["lr"], block.present["lr"]))
    return estimate_onset(block.steps, loss=loss, grad_norm=grad, per_rank=block,
                          finding_steps=finding_steps,
                          first_non_finite_step=first_non_finite_step,
                          warmup_end_step=warmup_end_step, search_from=search_from,
                          params=params)


def estimate_onset_near(
    block: StepBlock,
    *,
    finding_steps: Iterable[int],
    search_from: int,
    upto: int,
    params: OnsetParams = OnsetParams(),
) -> OnsetEstimate | None:
    """The onset of the incident that the findings at ``finding_steps`` vouch for, from the
    history around them only.

    The estimate may not start before ``search_from`` (what the evidence allows, see
    :func:`healthsvc_detectors.offline.rollback.onset_window`) and uses the history up to ``upto``; the trend it
    compares with is learned from ``2 * min_window`` samples before ``search_from``. Looking only
    near the evidence keeps a change point of the whole curve against its own trend (clean,
    smoothly decaying curves have some) and old, recovered events out of the answer.
    """
    lo = int(np.searchsorted(block.steps, search_from)) - 2 * params.min_window
    hi = int(np.searchsorted(block.steps, upto, side="right"))
    window = block.slice_steps(max(0, lo), hi)
    if window.n_steps == 0:
        return None
    return estimate_onset_from_block(window, finding_steps=finding_steps,
                                     search_from=search_from, params=params)



# --------------------------------------------------------------------------------------------
# Combination and origin
# --------------------------------------------------------------------------------------------

def _combine(signals: dict[str, SignalEstimate], steps: np.ndarray, grad_norm,
             per_rank: StepBlock | None) -> OnsetEstimate:
    # Findings say the problem existed by their step (an upper bound); the lower bound and the
    # point come from the history itself unless the findings are all there is.
    evidence = {k: s for k, s in signals.items() if k != "findings"} or signals
    high = min(s.high for s in signals.values())
    low = min(s.low for s in evidence.values())
    if low > high:  # the history shows the change only after a finding did: trust the finding
        low = min(high, signals["findings"].low) if "findings" in signals else high
    # The point rests on what the history shows; a change merely *located* because a finding
    # vouches for one (score 0) widens the interval but does not move the point, the finding does.
    pointers = ({k: s for k, s in evidence.items() if not s.detail.get("located_after_finding")}
                or ({"findings": signals["findings"]} if "findings" in signals else evidence))
    step = int(np.clip(min(s.step for s in pointers.values()), low, high))
    agree = [s for s in evidence.values() if s.low <= step <= s.high]
    confidence = max(s.score for s in evidence.values()) * len(agree) / len(evidence)
    if "findings" in signals:  # a finding vouches for a problem even when the history is mute
        confidence = max(confidence, signals["findings"].score)
    earliest = min(evidence.values(), key=lambda s: (s.step, s.signal))
    shape = earliest.shape
    origin, ranks = _origin(signals, step, per_rank)
    spike_end = _spike_end(steps, grad_norm, step) if shape == "abrupt" else None
    order = [k for k in ONSET_SIGNALS if k in signals]
    return OnsetEstimate(step=step, low=int(low), high=int(high),
                         confidence=float(np.clip(confidence, 0.0, 1.0)), signals_used=order,
                         per_signal=signals, shape=shape, origin=origin, ranks=ranks,
                         spike_end=spike_end)


def _origin(signals: dict[str, SignalEstimate], step: int,
            per_rank: StepBlock | None) -> tuple[Origin, tuple[int, ...]]:
    """Hardware when one rank disagrees with its peers; data when every rank changes at once."""
    rank_sig = signals.get("rank_disagreement")
    if rank_sig is not None and len(rank_sig.ranks) <= max(1, _n_ranks(per_rank) // 4):
        return "hardware", rank_sig.ranks
    nf = signals.get("non_finite")
    if nf is not None and nf.ranks and per_rank is not None:
        if len(nf.ranks) <= max(1, per_rank.n_ranks // 4):
            return "hardware", nf.ranks
        if len(nf.ranks) >= 0.75 * per_rank.n_ranks:
            return "data", ()
    if per_rank is not None:
        share = _share_of_ranks_jumping(per_rank, step)
        if share is not None and share >= 0.75:
            return "data", ()
    return "unknown", ()


def _n_ranks(block: StepBlock | None) -> int:
    return 0 if block is None else block.n_ranks


def _share_of_ranks_jumping(block: StepBlock, step: int, z_min: float = 4.0) -> float | None:
    """Share of ranks whose value at ``step..step+2`` leaves their own recent range."""
    for name in RANK_METRICS:
        if not block.has(name) or block.n_ranks < 2:
            continue
        at = int(np.searchsorted(block.steps, step))
        if at < 16 or at >= block.n_steps:
            continue
        v, p = block.values[name], block.present[name]
        base_v, base_p = v[max(0, at - 64):at], p[max(0, at - 64):at]
        ok = base_p & np.isfinite(base_v) & (base_v > 0)
        logb = np.where(ok, np.log(np.where(ok, base_v, 1.0)), np.nan)
        med = np.nanmedian(logb, axis=0)
        mad = np.nanmedian(np.abs(logb - med), axis=0) * 1.4826 + 1e-12
        now_v, now_p = v[at:at + 3], p[at:at + 3]
        with np.errstate(all="ignore"):
            z = (np.log(now_v) - med) / mad
        jumped = ((now_p & ~np.isfinite(now_v)) | (now_p & (z >= z_min))).any(axis=0)
        reported = now_p.any(axis=0)
        if reported.sum() >= 2:
            return float(jumped[reported].mean())
    return None


def _spike_end(steps: np.ndarray, grad_norm, step: int, z_min: float = 4.0) -> int | None:
    """Last step of the excursion of the gradient norm that starts at ``step`` (gaps <= 3)."""
    if grad_norm is None:
        return None
    g = np.asarray(grad_norm, float)
    at = int(np.searchsorted(steps, step))
    if at < 16 or at >= steps.size:
        return None
    base = g[max(0, at - 256):at]
    base = base[np.isfinite(base) & (base > 0)]
    if base.size < 8:
        return None
    logb = np.log(base)
    med = np.median(logb)
    mad = np.median(np.abs(logb - med)) * 1.4826 + 1e-12
    after = g[at:at + 4096]
    with np.errstate(all="ignore"):
        high = ~np.isfinite(after) | (np.log(np.abs(after) + 1e-300) - med >= z_min * mad)
    if not high[0]:
        return None
    quiet = np.flatnonzero(~high)
    # The excursion ends before the first run of four quiet samples.
    if quiet.size == 0:
        return int(steps[at + high.size - 1])
    runs = np.flatnonzero(np.convolve(~high, np.ones(4, int), mode="valid") == 4)
    end = (runs[0] if runs.size else high.size) - 1
    return int(steps[at + max(end, 0)])
