"""The signals of the onset estimate: each reads one kind of evidence from a run's history.

- :func:`non_finite_signal`: the first NaN/Inf (exact; a loss lags its update by one step);
- :func:`series_signal`: a change point in one aggregate series (loss trend, gradient norm);
- :func:`rank_signal`: a change point in one rank's deviation from the cross-rank median;
- :func:`history_signals`: the change point signals together;
- :func:`warmup_end_from_lr`: where the learning-rate warm-up ends (no change point before it).

Each returns a :class:`~healthsvc_detectors.offline.onset_model.SignalEstimate` in update steps, or None;
:mod:`healthsvc_detectors.offline.onset` combines them.
"""
from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.offline.changepoint import scan
from healthsvc_detectors.offline.onset_model import RANK_METRICS, OnsetParams, SignalEstimate


def history_signals(steps, loss, grad_norm, per_rank, anchor, params,
                    located: bool = False) -> dict[str, SignalEstimate]:
    """The change point signals of the history: loss trend, gradient norm, rank disagreement."""
    out: dict[str, SignalEstimate] = {}
    if loss is not None:
        est = series_signal("loss_trend", steps, np.asarray(loss, float), anchor, params, lag=1,
                            located=located)
        if est is not None:
            out["loss_trend"] = est
    if grad_norm is not None:
        est = series_signal("grad_norm", steps, np.asarray(grad_norm, float), anchor, params,
                            lag=0, located=located)
        if est is not None:
            out["grad_norm"] = est
    if per_rank is not None:
        est = rank_signal(per_rank, anchor, params, located=located)
        if est is not None:
            out["rank_disagreement"] = est
    return out


# Steps the learning rate must hold a level for it to count as the schedule's: a blow-up (the LR
# x8 for 20 steps) is an excursion above the schedule, not the end of its warm-up.
SCHEDULE_HOLD_STEPS = 64


def warmup_end_from_lr(steps: np.ndarray, lr: np.ndarray) -> int | None:
    """The first step from which the learning rate holds 99 % of its peak, if it rose to it.

    The peak is the highest level the LR holds for ``SCHEDULE_HOLD_STEPS`` samples (fewer in a
    short history: an eighth of it), so a short LR blow-up after the warm-up is not taken for
    its end (which would hide the blow-up's own change point from the estimate).

    >>> warmup_end_from_lr(np.arange(10), np.array([1, 2, 3, 4, 5, 5, 5, 4, 3, 2.0]))
    4
    >>> lr = np.r_[np.linspace(0.1, 1, 100), np.ones(300)]
    >>> lr[250:270] *= 8                                   # a blow-up after the warm-up
    >>> warmup_end_from_lr(np.arange(400), lr)              # not 250
    98
    """
    lr = np.asarray(lr, float)
    ok = np.isfinite(lr)
    if ok.sum() < 2:
        return None
    st, x = np.asarray(steps)[ok], lr[ok]
    hold = max(1, min(SCHEDULE_HOLD_STEPS, len(x) // 8))
    # held[i]: the level the LR holds over samples i .. i + hold - 1.
    held = np.lib.stride_tricks.sliding_window_view(x, hold).min(axis=1) if hold > 1 else x
    peak = held.max()
    at = int(np.argmax(held >= 0.99 * peak))
    if at == 0 or x[0] >= 0.99 * peak:
        return None
    return int(st[at])


def non_finite_signal(steps, loss, grad_norm, per_rank, known_step) -> SignalEstimate | None:
    """The first non-finite value; the loss lags the update by one step, gradients do not."""
    candidates: list[tuple[int, int, str, tuple[int, ...]]] = []  # (update low, high, metric, ranks)
    if known_step is not None:
        candidates.append((int(known_step) - 1, int(known_step), "reported", ()))
    for name, series, lag in (("loss", loss, 1), ("grad_norm", grad_norm, 0)):
        # With the per-rank block at hand its masks tell a NaN from a step nobody reported (the
        # aggregate is NaN in both cases): NaN is data, missing is not.
        if series is None or (per_rank is not None and per_rank.has(name)):
            continue
        idx = np.flatnonzero(~np.isfinite(np.asarray(series, float)))
        if idx.size:
            t = int(steps[idx[0]])
            # A NaN loss at t: poisoned weights (update t-1) or a poisoned batch (update t).
            candidates.append((t - lag, t, name, ()))
    if per_rank is not None:
        for name in ("local_grad_norm", "loss", "grad_norm"):
            if not per_rank.has(name):
                continue
            bad = per_rank.present[name] & ~np.isfinite(per_rank.values[name])
            rows = np.flatnonzero(bad.any(axis=1))
            if rows.size:
                t = int(per_rank.steps[rows[0]])
                lag = 1 if name == "loss" else 0
                # The global norm is the same on every rank: it cannot say where a NaN began.
                ranks = (() if name == "grad_norm"
                         else tuple(int(r) for r in per_rank.ranks[bad[rows[0]]]))
                candidates.append((t - lag, t, name, ranks))
    if not candidates:
        return None
    low = min(c[0] for c in candidates)
    high = min(c[1] for c in candidates)
    # Among the earliest, prefer a per-rank metric that names its ranks (the fewest: the origin).
    first = min(candidates, key=lambda c: (c[1], not c[3], len(c[3])))
    # The earliest update the values allow: exact when a gradient norm went non-finite first.
    return SignalEstimate("non_finite", step=min(low, high), low=min(low, high), high=high,
                          shape="abrupt", score=1.0, ranks=first[3],
                          detail={"metric": first[2], "first_step": first[1]})


def series_signal(name: str, steps: np.ndarray, values: np.ndarray, anchor: int | None,
                  params: OnsetParams, lag: int, located: bool = False) -> SignalEstimate | None:
    """A change point in one aggregate series, converted to update steps (``lag`` = 1 for loss)."""
    ok = np.isfinite(values)
    if not ok.any():
        return None
    y = values[ok]
    if np.all(y > 0):
        y = np.log(y)
        space = "log"
    else:
        space = "linear"
    change = scan(steps[ok], y, direction=1.0, anchor=anchor, params=params, located=located)
    if change is None:
        return None
    # A loss first changed at t: poisoned weights (update t - 1) or a poisoned batch whose own
    # forward pass shows it (update t). Keep both in the interval; the point is the earlier.
    return SignalEstimate(
        name, step=change.step - lag, low=change.low - lag, high=change.high,
        shape=change.shape, score=change.score,
        detail={**change.detail, "space": space, "lag_steps": lag})


def rank_signal(block: StepBlock, anchor: int | None, params: OnsetParams,
                located: bool = False) -> SignalEstimate | None:
    """One rank's log deviation from the cross-rank median: a change point in that series."""
    for name in RANK_METRICS:
        if not block.has(name) or block.n_ranks < 3:
            continue
        # Only the recent rows: per-rank work is n x r, and a rank that has disagreed for longer
        # than this is better told by the loss and gradient norm over the whole history.
        rows0 = max(0, block.n_steps - params.rank_history_steps)
        v, p = block.values[name][rows0:], block.present[name][rows0:]
        valid = p & np.isfinite(v) & (v > 0)
        logv = np.log(np.where(valid, v, 1.0))
        med = row_median(logv, valid)
        dev = np.where(valid, logv - med[:, None], np.nan)
        counts = valid.sum(axis=1)
        dev[counts < 3] = np.nan  # a median of two ranks says nothing about either
        rows = counts >= 3
        dev, rank_steps = dev[rows], block.steps[rows0:][rows]
        if dev.shape[0] < 24:
            continue
        # The typical spread of a rank around the median (recent rows suffice: O(1) in n).
        recent = dev[-65536:]
        scale = np.median(np.abs(recent[np.isfinite(recent)])) * 1.4826 if np.isfinite(
            recent).any() else np.nan
        if not np.isfinite(scale) or scale <= 0:
            continue
        suspect, direction, score, tail = _suspect_rank(dev, scale)
        if score < params.rank_score_min:
            continue
        series = dev[:, suspect]
        ok = np.isfinite(series)
        change = scan(rank_steps[ok], series[ok], direction=direction, anchor=anchor,
                       params=replace(params, min_excess_sigma=min(
                           params.min_excess_sigma, params.rank_min_excess_sigma)),
                       located=located)
        if change is None:
            continue
        tail_means, tail_counts = _column_means(dev[-tail:])
        blamed = np.flatnonzero(direction * tail_means * np.sqrt(tail_counts) / scale
                                >= max(params.rank_score_min, 0.5 * score))
        ranks = tuple(int(r) for r in block.ranks[blamed]) or (int(block.ranks[suspect]),)
        return SignalEstimate(
            "rank_disagreement", step=change.step, low=change.low, high=change.high,
            shape=change.shape, score=change.score, ranks=ranks,
            detail={**change.detail, "metric": name, "rank_score": round(float(score), 2)})
    return None


def _suspect_rank(dev: np.ndarray, scale: float) -> tuple[int, float, float, int]:
    """The rank whose recent mean deviation is largest, as a t-statistic over a few tails."""
    best = (0, 1.0, 0.0, 1)
    for tail in (8, 64, 512):
        tail = min(tail, dev.shape[0])
        means, counts = _column_means(dev[-tail:])
        stat = np.abs(means) * np.sqrt(counts) / scale
        r = int(np.argmax(stat))
        if stat[r] > best[2]:
            best = (r, float(np.sign(means[r]) or 1.0), float(stat[r]), tail)
    return best


def _column_means(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean of the finite entries of each column (0 where none) and their count."""
    ok = np.isfinite(x)
    counts = ok.sum(axis=0)
    sums = np.where(ok, x, 0.0).sum(axis=0)
    return sums / np.maximum(counts, 1), counts


def row_median(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Median over the finite, present entries of each row; NaN where a row has none.

    The middle pair is halved before it is added, so values near the float limit do not
    overflow (halving is exact: the result is the same elsewhere).

    >>> row_median(np.array([[1.0, np.nan, 3.0, 2.0], [1e308, 1.7e308, 0.0, 0.0]]),
    ...            np.array([[True, True, True, True], [True, True, False, False]]))
    array([2.00e+000, 1.35e+308])
    """
    valid = present & np.isfinite(values)
    count = valid.sum(axis=1)
    x = np.sort(np.where(valid, values, np.inf), axis=1)
    lo = np.maximum((count - 1) // 2, 0)
    hi = np.maximum(count // 2, 0)
    hi = np.minimum(hi, np.maximum(count - 1, 0))
    rows = np.arange(values.shape[0])
    med = 0.5 * x[rows, lo] + 0.5 * x[rows, hi]
    med[count == 0] = np.nan
    return med


# A rise "began abruptly" when, within this many steps after the last step at its best, the loss
# stood at least ABRUPT_RISE_Z robust noise units above the steps before it for ABRUPT_RISE_RUN
# steps in a row. A hard batch is one step; a slow drift stays within a few noise units of its
# recent past for tens of steps (its smoothed level lags the raw loss by ~1/alpha steps of drift).
ABRUPT_RISE_STEPS = 8
ABRUPT_RISE_RUN = 3
ABRUPT_RISE_Z = 3.0
ABRUPT_RISE_BASE_STEPS = 64


def _robust_base(y: np.ndarray, at: int) -> tuple[float, float] | None:
    """The median and the MAD-based sd of the ``ABRUPT_RISE_BASE_STEPS`` finite values of ``y``
    before index ``at``: the level a rise is measured from and its noise (None: too few values)."""
    base = y[max(0, at - ABRUPT_RISE_BASE_STEPS):at]
    base = base[np.isfinite(base)]
    if base.size < ABRUPT_RISE_BASE_STEPS // 2:
        return None
    centre = float(np.median(base))
    return centre, max(float(np.median(np.abs(base - centre))) * 1.4826, 1e-6)


def rise_began_abruptly(block: StepBlock, best_step: int) -> int | None:
    """The first step of a jump of the aggregate loss within ``ABRUPT_RISE_STEPS`` steps after
    ``best_step`` (the last step a drift-kind finding saw at its best), or None when the rise
    was gradual or the history cannot tell (no loss, too little of it before ``best_step``).

    The aggregate is the median over the ranks of the log loss; the noise is the MAD of the
    ``ABRUPT_RISE_BASE_STEPS`` steps up to ``best_step`` around their median. A jump is
    ``ABRUPT_RISE_RUN`` consecutive steps at least ``ABRUPT_RISE_Z`` noise units above it, the
    first of which lies in ``best_step + 1 .. best_step + ABRUPT_RISE_STEPS``.

    >>> import numpy as np
    >>> steps = np.arange(1, 401)
    >>> loss = 2.0 * np.exp(np.random.default_rng(0).normal(0, 0.02, (400, 4)))
    >>> loss[steps > 300] *= 1.5                                       # the LR blew up at 301
    >>> block = StepBlock.from_dense(steps, np.arange(4), loss=loss)
    >>> rise_began_abruptly(block, 299), rise_began_abruptly(block, 250)
    (301, None)
    >>> loss[steps > 300] /= 1.5; loss *= np.exp(np.maximum(0, steps - 300) * 2e-3)[:, None]  # a drift
    >>> rise_began_abruptly(StepBlock.from_dense(steps, np.arange(4), loss=loss.copy()), 299) is None
    True
    """
    if not block.has("loss"):
        return None
    at = int(np.searchsorted(block.steps, best_step, side="right"))
    if at < ABRUPT_RISE_BASE_STEPS // 2:
        return None
    loss = row_median(block.values["loss"], block.present["loss"])
    with np.errstate(all="ignore"):
        y = np.log(np.where(loss > 0, loss, np.nan))
    base = _robust_base(y, at)
    if base is None:
        return None
    centre, noise = base
    ahead = y[at:at + ABRUPT_RISE_STEPS + ABRUPT_RISE_RUN - 1]
    high = np.isfinite(ahead) & (ahead - centre >= ABRUPT_RISE_Z * noise)
    for i in range(min(ABRUPT_RISE_STEPS, high.size - ABRUPT_RISE_RUN + 1)):
        if high[i:i + ABRUPT_RISE_RUN].all() and block.steps[at + i] - best_step <= ABRUPT_RISE_STEPS:
            return int(block.steps[at + i])
    return None


# How far before a per-rank episode's onset its rank's jump may lie: the detector's weighted mean
# (gain 1/100) needs 30 / z steps of a step change of z of its own sds to pass half the warning
# level (0.3), the onset it reports; 16 steps covers a change of 2 sds or more.
ABRUPT_RANK_LAG_STEPS = 16


def rank_rise_began_abruptly(block: StepBlock, ranks: tuple[int, ...], onset: int) -> int | None:
    """The first step of a jump of ``ranks``' own loss against their peers' (each step's log loss
    of the named ranks, averaged, minus the median of the others') within
    ``ABRUPT_RANK_LAG_STEPS`` steps before a per-rank episode's ``onset`` up to
    ``ABRUPT_RISE_STEPS`` after it; None when that rise was gradual, the ranks have no peers
    left, or the history cannot tell.

    The shape of a replica whose weights were corrupted at one step (a bit flip): its loss
    jumps at once, against peers that did not move, and stays above theirs (data-parallel
    replicas never re-sync). The aggregate loss (:func:`rise_began_abruptly`) hardly moves when
    one rank of several jumps, and the detector names it only once its weighted mean has
    grown, a few steps after the jump: hence the lag. The noise and the rule are those of
    :func:`rise_began_abruptly` (``ABRUPT_RISE_RUN`` steps in a row at least ``ABRUPT_RISE_Z``
    noise units above the median of the ``ABRUPT_RISE_BASE_STEPS`` steps before the search).

    >>> import numpy as np
    >>> steps = np.arange(1, 401)
    >>> loss = 2.0 * np.exp(np.random.default_rng(0).normal(0, 0.05, (400, 4)))
    >>> loss[steps > 300, 3] *= np.where(steps[steps > 300] <= 320, 1.3, 1.1)   # a jump at 301
    >>> block = StepBlock.from_dense(steps, np.arange(4), loss=loss)
    >>> rank_rise_began_abruptly(block, (3,), 308), rank_rise_began_abruptly(block, (2,), 308)
    (301, None)
    >>> loss[steps > 300, 3] /= np.where(steps[steps > 300] <= 320, 1.3, 1.1)
    >>> loss[:, 3] *= np.exp(np.maximum(0, steps - 300) * 1e-3)                  # a drift
    >>> rank_rise_began_abruptly(StepBlock.from_dense(steps, np.arange(4), loss=loss), (3,), 380) is None
    True
    """
    if not block.has("loss") or not ranks:
        return None
    named = np.isin(block.ranks, np.asarray(ranks))
    if not named.any() or named.all():
        return None
    x, present = block.values["loss"], block.present["loss"]
    with np.errstate(all="ignore"):
        y = np.log(np.where(present & (x > 0), x, np.nan))
        own = np.nanmean(y[:, named], axis=1) if named.sum() > 1 else y[:, named][:, 0]
        others = y[:, ~named]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # a row with no peer value
            rel = own - np.nanmedian(others, axis=1)
    at = int(np.searchsorted(block.steps, onset - ABRUPT_RANK_LAG_STEPS, side="left"))
    base = _robust_base(rel, at)
    if base is None:
        return None
    centre, noise = base
    last = int(np.searchsorted(block.steps, onset + ABRUPT_RISE_STEPS, side="right"))
    ahead = rel[at:last + ABRUPT_RISE_RUN - 1]
    with np.errstate(invalid="ignore"):
        high = np.isfinite(ahead) & (ahead - centre >= ABRUPT_RISE_Z * noise)
    for i in range(min(last - at, high.size - ABRUPT_RISE_RUN + 1)):
        if high[i:i + ABRUPT_RISE_RUN].all():
            return int(block.steps[at + i])
    return None
