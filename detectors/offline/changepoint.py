"""Change points after a trend, for every candidate at once: the machinery of the onset estimate.

Model of a series ``y`` (log loss, log gradient norm, a rank's log deviation from its peers): a
trend (quadratic in ``log(step)`` plus linear in ``step``) plus one of

- a level shift at ``tau`` (column ``1[i >= tau]``): an abrupt change that persists,
- a one-sample pulse at ``tau`` (column ``1[i == tau]``): a burst already over,
- a hinge at ``tau`` (column ``max(0, step - step_tau)``): a drift.

Adding one column ``c`` to a least-squares fit lowers the residual sum of squares by
``(c' r0)^2 / |c - QQ'c|^2`` (``r0`` the trend's residual, ``Q`` its orthonormal basis); for the
three families every term is a suffix sum, so all candidates cost O(n) together. The likelihood
ratio divides that gain by the residual variance inflated by the AR(1) long-run factor
``(1 + rho) / (1 - rho)``; the interval is every candidate within ``interval_lr`` of the best.
:func:`scan` runs the fit in windows that end at the newest sample and double in length.

Example: a level shift at index 300 of white noise.

>>> import numpy as np
>>> from healthsvc_detectors.offline.onset_model import OnsetParams
>>> rng = np.random.default_rng(1)
>>> y = rng.normal(0, 1, 400); y[300:] += 3
>>> c = scan(np.arange(1000, 1400), y, direction=1.0, anchor=None, params=OnsetParams())
>>> c.step, c.shape, c.low <= 1300 <= c.high
(1300, 'abrupt', True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from healthsvc_detectors.offline.onset_model import OnsetParams, Shape


@dataclass(frozen=True)
class Change:
    """A change found by :func:`scan`, in steps; ``score`` in [0, 1): 0 at the threshold."""

    step: int      # first step showing the change
    low: int       # first step that may show it
    high: int      # last step by which it shows
    shape: Shape
    score: float
    detail: dict[str, Any]


@dataclass(frozen=True)
class Fit:
    """A change found by :func:`fit_change`, in sample positions."""

    index: int
    low_index: int
    high_index: int
    shape: Shape
    lr: float
    threshold: float
    excess_sigma: float


def scan(steps: np.ndarray, y: np.ndarray, direction: float, anchor: int | None,
          params: OnsetParams, located: bool = False) -> Change | None:
    """Fit change points in windows that end at the last sample and double in length.

    The first window with a significant change whose interval leaves enough history before it
    wins. ``located`` (a finding vouches for a change the history does not show clearly): every
    window is tried and the earliest change found is kept, which is the conservative choice.
    """
    n = y.size
    window = params.min_window
    if anchor is not None:
        window = max(window, 4 * int(n - np.searchsorted(steps, anchor)))
    found: list[Change] = []
    touching: list[Change] = []
    while True:
        i0 = max(0, n - window)
        t, v, first, last = binned(steps[i0:], y[i0:], params.max_points)
        # A change needs enough history before it to know the trend it departs from. Searching
        # everywhere and refusing changes in the first 1 / (1 + min_pre_ratio) of the window
        # keeps a long window's misfit of old transients (the warm-up) from passing for a
        # change: such a window's strongest feature is early. A located search is restricted to
        # the later part instead, so it always names a candidate.
        k_min = max(8, math.ceil(params.min_pre_ratio * v.size / (1.0 + params.min_pre_ratio)))
        fit = fit_change(t, v, direction, params, k_min if located else 8)
        # A located change may touch the boundary (kept as a last resort, smallest window first).
        if fit is not None and (fit.low_index > k_min or located):
            low = int(last[fit.low_index - 1]) + 1 if fit.low_index > 0 else int(first[0])
            (found if fit.low_index > k_min else touching).append(Change(
                step=int(first[fit.index]), low=low, high=int(last[fit.high_index]),
                shape=fit.shape, score=1.0 - fit.threshold / fit.lr,
                detail={"lr": round(fit.lr, 2), "threshold": round(fit.threshold, 2),
                        "excess_sigma": round(fit.excess_sigma, 2),
                        "window": [int(steps[i0]), int(steps[-1])],
                        "bin_steps": int(max(1, round((n - i0) / v.size)))}))
            if found and not located:
                return found[0]
        if i0 == 0:
            if found:
                return min(found, key=lambda c: c.low)
            return touching[0] if touching else None
        window *= 2


def binned(steps: np.ndarray, y: np.ndarray, max_points: int):
    """Means over equal bins aligned to the end (the newest samples matter most)."""
    n = y.size
    if n <= max_points:
        return steps.astype(float), y, steps, steps
    size = math.ceil(n / max_points)
    head = n % size
    starts = np.arange(head, n, size)
    if head:
        starts = np.concatenate([[0], starts])
    counts = np.diff(np.append(starts, n))
    t = np.add.reduceat(steps.astype(float), starts) / counts
    v = np.add.reduceat(y, starts) / counts
    last = np.append(steps[starts[1:] - 1], steps[-1])
    return t, v, steps[starts], last


def _suffix(a: np.ndarray) -> np.ndarray:
    # Summing from the end keeps the small tail sums accurate.
    return np.cumsum(a[::-1], axis=0)[::-1]


def fit_change(t: np.ndarray, y: np.ndarray, direction: float, params: OnsetParams,
                k_min: int = 8) -> Fit | None:
    """Best level shift or hinge after a quadratic trend in log(step), for all taus in O(n)."""
    n = y.size
    if n < 24:
        return None
    span = max(t[-1] - t[0], 1.0)
    tn = (t - t[0]) / span
    x = np.log1p(np.maximum(t, 0.0))  # the trend lives in log(step), the shape of loss curves
    x = (x - x.mean()) / (x.std() or 1.0)
    q, _ = np.linalg.qr(np.column_stack([np.ones(n), x, x * x, tn]))
    r0 = y - q @ (q.T @ y)
    rss0 = float(r0 @ r0)
    if rss0 <= 1e-18 * max(float(y @ y), 1e-300):  # the trend explains it all (a constant)
        return None
    count = np.arange(n, 0, -1, dtype=float)
    sr, sq = _suffix(r0), _suffix(q)
    # Level shift at k: column 1[i >= k]; gain = (c' r0)^2 / |c orthogonal to the trend|^2.
    num_step = sr
    den_step = count - np.einsum("ij,ij->i", sq, sq)
    # Hinge at k: column (t_i - t_k)+.
    st, stt, str_, stq = _suffix(tn), _suffix(tn * tn), _suffix(tn * r0), _suffix(tn[:, None] * q)
    num_hinge = str_ - tn * sr
    hq = stq - tn[:, None] * sq
    hh = stt - 2 * tn * st + tn * tn * count
    den_hinge = hh - np.einsum("ij,ij->i", hq, hq)

    # One-sample pulse at k (a burst that is over by the next step): column 1[i == k].
    num_pulse = r0
    den_pulse = 1.0 - np.einsum("ij,ij->i", q, q)

    gains = []
    for model, num, den, k_max, scale in (("step", num_step, den_step, n - 1, count),
                                           ("hinge", num_hinge, den_hinge, n - 3, hh),
                                           ("pulse", num_pulse, den_pulse, n - 1, np.ones(n))):
        ok = np.zeros(n, bool)
        ok[k_min:k_max + 1] = True
        ok &= (den > 1e-9 * np.maximum(scale, 1e-300)) & (num * direction > 0)
        gains.append((model, np.where(ok, num * num / np.where(ok, den, 1.0), 0.0), num / np.where(ok, den, 1.0)))
    model, best_gain, best_coef = max(gains, key=lambda g: g[1].max())
    k = int(np.argmax(best_gain))
    gain = float(best_gain[k])
    if gain <= 0:
        return None
    coef = float(best_coef[k])
    column = {"step": (np.arange(n) >= k).astype(float),
              "hinge": np.maximum(tn - tn[k], 0.0),
              "pulse": (np.arange(n) == k).astype(float)}[model]
    resid = r0 - coef * (column - q @ (q.T @ column))
    # Autocorrelated residuals (hard batches come in runs; a trend that does not quite fit
    # leaves slow wiggles) carry less information than white noise: scale sigma^2 up by the
    # AR(1) long-run factor (1 + rho) / (1 - rho) so neither passes for a change point.
    rho = float(np.clip((resid[1:] @ resid[:-1]) / max(float(resid @ resid), 1e-300), 0.0, 0.98))
    sigma2 = max(rss0 - gain, 1e-300) / max(n - 6, 1) * (1.0 + rho) / (1.0 - rho)
    lr = gain / sigma2
    threshold = 2.0 * math.log(n) + params.significance
    if model == "hinge":
        excess = abs(coef) * (tn[-1] - tn[k])
    else:
        excess = abs(coef)  # the shift, or the pulse's height
    excess_sigma = excess / math.sqrt(sigma2)
    if lr <= threshold or excess_sigma < params.min_excess_sigma:
        return None
    best_shape: Shape = "gradual" if model == "hinge" else "abrupt"
    # The interval: every tau, of either shape, whose LR is within interval_lr of the best.
    inside = np.zeros(n, bool)
    for _, g, _ in gains:
        inside |= (gain - g) / sigma2 <= params.interval_lr
    idx = np.flatnonzero(inside)
    return Fit(index=k, low_index=int(idx[0]), high_index=int(idx[-1]), shape=best_shape,
                lr=float(lr), threshold=float(threshold), excess_sigma=float(excess_sigma))
