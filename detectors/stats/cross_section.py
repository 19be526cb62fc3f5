"""Shared robust-statistics helpers for the value detectors (loss, gradient norms).

Everything here is deterministic, vectorised over ranks and split-invariant: feeding a series in
one block or in many gives the same numbers, because state carried between blocks is exactly what a
step-by-step recursion would carry.

- :func:`log_positive` — values in log space (non-positive or non-finite values become invalid).
- :func:`reference_positions`, :func:`cross_section` — per-step centre (median) and scale
  (IQR / 1.349, a robust standard deviation) across ranks, estimated on at most ``max_ranks``
  ranks chosen by rank id, so the cost stays flat at 16k ranks and a permutation of the columns
  changes nothing.
- :class:`RankTable` — per-rank state arrays keyed by rank id (ranks may appear at any time;
  a missing rank keeps its state untouched).
- :func:`hysteresis`, :func:`run_length`, :func:`last_step_where` — block-vectorised state
  machines with a carry from the previous block.
- :func:`ewma_rows` — an exponentially weighted mean per rank that skips missing cells.
- :class:`RobustTrend` — a scalar level + trend baseline in log space (Holt's linear smoothing
  with a robust scale and warm-up): its level learns only values a detector judged normal, its
  scale also the others, clipped (:meth:`RobustTrend.learn_scale`).
- :func:`excess_score` — the common score scale: 0 at the firing threshold, 1 at the level the
  detector calls as bad as it gets.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

# IQR of a normal distribution in standard deviations, and E|X| / sd for a normal.
IQR_TO_SD = 1.0 / 1.3489795003921634
MEAN_ABS_TO_SD = math.sqrt(math.pi / 2.0)


def log_positive(x: np.ndarray, present: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(log(x), valid)``: valid where reported, finite and > 0; log is NaN elsewhere.

    Loss and gradient norms are positive; a non-finite value is the ``non_finite`` detector's
    business, and a cell that is not present is never a value at all.
    """
    valid = (x > 0) & (x < np.inf)      # NaN compares False
    if present is not None:
        valid &= present
    y = np.full(x.shape, np.nan)
    np.log(x, out=y, where=valid)       # only where valid: no warnings, no second pass
    return y, valid


def excess_score(stat: np.ndarray | float, warn: float, crit: float) -> np.ndarray | float:
    """Score in [0, 1]: 0 at ``warn`` (the firing threshold), 1 at and beyond ``crit``."""
    span = max(crit - warn, 1e-12)
    return np.clip((np.asarray(stat, dtype=np.float64) - warn) / span, 0.0, 1.0)


# ---------------------------------------------------------------------------- cross sections
def reference_positions(ranks: np.ndarray, max_ranks: int) -> np.ndarray:
    """Column positions of at most ``max_ranks`` ranks, every k-th in rank-id order.

    Chosen by id, so permuting the columns of a block selects the same ranks.
    """
    order = np.argsort(ranks, kind="stable")
    if len(order) <= max_ranks:
        return order
    stride = -(-len(order) // max_ranks)  # ceil
    return order[::stride]


class ReferenceRanks:
    """:func:`reference_positions` with the answer for the last rank set cached (blocks of a run
    nearly always carry the same ranks). Not learned state: nothing to save."""

    def __init__(self, max_ranks: int) -> None:
        self.max_ranks = max_ranks
        self._key: bytes | None = None
        self._pos = np.zeros(0, dtype=np.int64)

    def __call__(self, ranks: np.ndarray) -> np.ndarray:
        key = ranks.tobytes()
        if key != self._key:
            self._key, self._pos = key, reference_positions(ranks, self.max_ranks)
        return self._pos


def cross_section(y: np.ndarray, valid: np.ndarray, ref: np.ndarray | None, min_count: int = 1,
                  with_scale: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row ``(centre, scale, count)`` of ``y[:, ref]`` over valid cells (``ref=None``: all
    columns).

    ``centre`` is the median, ``scale`` the IQR / 1.349 (a robust sd; NaN when ``with_scale`` is
    False); rows with fewer than ``min_count`` valid reference cells get NaN. Quantiles follow
    numpy's default (linear) rule, so the result equals ``np.quantile`` on the valid cells.
    """
    ys, vs = (y, valid) if ref is None else (y[:, ref], valid[:, ref])
    n, m = ys.shape
    qs = _QUARTILES if with_scale else _MEDIAN
    if vs.all():   # the usual case: one sort for the whole block
        count = np.full(n, m)
        if m == 0 or m < min_count:
            q = np.full((n, len(qs)), np.nan)
        else:
            q = _row_quantiles(ys, qs)
    else:          # rows with holes (a late rank, a NaN): one by one
        count = vs.sum(axis=1)
        q = np.full((n, len(qs)), np.nan)
        for i in np.flatnonzero(count >= max(min_count, 1)):
            q[i] = _row_quantiles(ys[i, vs[i]][None, :], qs)[0]
    if with_scale:
        return q[:, 1], (q[:, 2] - q[:, 0]) * IQR_TO_SD, count
    return q[:, 0], np.full(n, np.nan), count


_QUARTILES = (0.25, 0.5, 0.75)
_MEDIAN = (0.5,)


@functools.lru_cache(maxsize=64)
def _quantile_index(m: int, qs: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Order-statistic positions and weights of numpy's linear rule for ``m`` values."""
    h = np.array([(m - 1) * q for q in qs])
    lo = np.floor(h).astype(np.int64)
    return lo, np.minimum(lo + 1, m - 1), h - lo


def _row_quantiles(x: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """``(rows, len(qs))`` linear-rule quantiles. A full row sort: numpy's SIMD sort beats both
    ``np.quantile`` and a multi-kth ``np.partition`` by ~10x on rows of a few hundred values."""
    lo, hi, frac = _quantile_index(x.shape[1], qs)
    srt = np.sort(x, axis=1)
    a = srt[:, lo]
    return a + frac * (srt[:, hi] - a)


# ---------------------------------------------------------------------------- per-rank state
class RankTable:
    """Per-rank state arrays keyed by rank id.

    ``fields`` maps a name to its default value (its dtype follows the default). ``positions``
    returns, for the columns of a block, the rows of the state arrays, adding unknown ranks with
    default state. Ranks never seen again keep their state.

    >>> t = RankTable({"count": 0})
    >>> t.positions(np.array([3, 1])).tolist()
    [1, 0]
    >>> t.positions(np.array([2])).tolist(), t.ids.tolist()
    ([1], [1, 2, 3])
    """

    def __init__(self, fields: dict[str, Any]) -> None:
        self.defaults = dict(fields)
        self.ids = np.zeros(0, dtype=np.int64)
        self.arrays = {k: np.zeros(0, dtype=np.asarray(v).dtype) for k, v in fields.items()}
        self._cache_key: bytes | None = None
        self._cache_pos: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def positions(self, ranks: np.ndarray) -> np.ndarray:
        key = ranks.tobytes()
        if key == self._cache_key and self._cache_pos is not None:
            return self._cache_pos
        new = np.setdiff1d(ranks, self.ids)
        if len(new):
            at = np.searchsorted(self.ids, new)
            self.ids = np.insert(self.ids, at, new)
            for k, arr in self.arrays.items():
                self.arrays[k] = np.insert(arr, at, self.defaults[k])
        pos = np.searchsorted(self.ids, ranks)
        self._cache_key, self._cache_pos = key, pos
        return pos

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.arrays[name] = value

    def state_dict(self) -> dict[str, Any]:
        return {"ids": self.ids.tolist(), **{k: _to_json(a) for k, a in self.arrays.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ids = np.asarray(state["ids"], dtype=np.int64)
        for k, default in self.defaults.items():
            self.arrays[k] = _from_json(state[k], np.asarray(default).dtype)
        self._cache_key, self._cache_pos = None, None


def _to_json(a: np.ndarray) -> list:
    # JSON has no NaN: encode non-finite floats as strings so state survives any JSON encoder.
    if a.dtype.kind == "f":
        return [float(v) if math.isfinite(v) else repr(float(v)) for v in a.tolist()]
    return a.tolist()


def _from_json(values: list, dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "f":
        return np.array([float(v) for v in values], dtype=dtype)
    return np.asarray(values, dtype=dtype)


def float_to_json(v: float | None) -> float | str | None:
    """A float for a JSON state dict: non-finite values as the strings 'nan', 'inf', '-inf'."""
    if v is None:
        return None
    return float(v) if math.isfinite(v) else repr(float(v))


def float_from_json(v: float | str | None) -> float | None:
    return None if v is None else float(v)


# ------------------------------------------------------------------- block-vectorised machines
def hysteresis(enter: np.ndarray, leave: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """State per (row, column): on after an ``enter`` row, off after a ``leave`` row.

    ``enter`` wins when both hold on the same row. Rows with neither keep the previous state;
    ``carry`` (per column) is the state before the first row. Exactly the sequential machine.
    """
    n = enter.shape[0]
    idx = np.arange(n)[:, None]
    last_on = np.maximum.accumulate(np.where(enter, idx, -1), axis=0)
    last_off = np.maximum.accumulate(np.where(leave & ~enter, idx, -1), axis=0)
    return np.where(last_on > last_off, True, np.where(last_off > last_on, False, carry[None, :]))


def run_length(active: np.ndarray, observed: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """Consecutive observed rows with ``active`` per column, counting from ``carry``.

    An observed row where ``active`` is False resets the count; an unobserved row neither counts
    nor resets (missing is not evidence either way).
    """
    hits = (active & observed).astype(np.int64)
    cum = np.cumsum(hits, axis=0) + carry[None, :]
    reset = observed & ~active
    base = np.maximum.accumulate(np.where(reset, cum, 0), axis=0)
    return cum - base


def last_step_where(mask: np.ndarray, steps: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """Per (row, column): the latest step at or before the row where ``mask`` held (else carry)."""
    marked = np.where(mask, steps[:, None], np.iinfo(np.int64).min)
    return np.maximum(np.maximum.accumulate(marked, axis=0), carry[None, :])


def ewma_rows(x: np.ndarray, observed: np.ndarray | None, alpha: float, m0: np.ndarray,
          zero_below: float = 0.0) -> np.ndarray:
    """Per-column exponentially weighted mean after each row: the (n, r) trajectory.

    ``m = (1 - g) m + g x`` with ``g = alpha`` where observed and 0 elsewhere (a missing cell
    leaves the mean exactly as it was); ``observed=None`` means every cell (a faster path that
    rounds identically). Means below ``zero_below`` become exactly 0. Works in ``x``'s dtype;
    ``x`` is overwritten.

    >>> ewma_rows(np.array([[1.0], [1.0]]), None, 0.5, np.zeros(1)).ravel().tolist()
    [0.5, 0.75]
    """
    dtype = x.dtype
    out = np.empty(x.shape, dtype=dtype)
    prev = m0.astype(dtype, copy=True)
    if observed is None:
        x *= dtype.type(alpha)
        keep: np.ndarray | float = dtype.type(1.0) - dtype.type(alpha)   # as the masked path rounds it
        keep_rows = None
    else:
        gain = np.where(observed, dtype.type(alpha), dtype.type(0.0))
        np.copyto(x, 0.0, where=~observed)
        x *= gain
        keep_rows = 1.0 - gain
    for i in range(x.shape[0]):   # sequential in steps, vectorised over ranks, in place
        row = out[i]
        np.multiply(prev, keep if keep_rows is None else keep_rows[i], out=row)
        row += x[i]
        if zero_below:
            row[row < zero_below] = 0.0
        prev = row
    return out


# --------------------------------------------------------------------------- scalar baseline
class RobustTrend:
    """Level + trend of a scalar series in log space, with a robust scale and warm-up.

    One-step prediction ``pred = level + trend``; residual ``r = y - pred``; scale ``s`` is the
    EWMA of ``|r|`` turned into a standard deviation (x sqrt(pi/2)), floored at ``min_scale``.
    :meth:`zscore` scores a value without learning it; :meth:`learn` updates the state (the caller
    learns only values it judged normal, so a spike does not drag the baseline up). During the
    first ``warmup_steps`` learned values the gains start at 1/n so the baseline settles fast;
    afterwards residuals are clipped to ``clip`` scales (Huber) so a single odd value moves the
    level little.

    Parameters: ``alpha`` level gain, ``beta`` trend gain (relative to alpha), ``scale_alpha``
    gain of the scale, ``min_scale`` floor in log units (0.005 ~ 0.5 %).

    >>> b = RobustTrend(warmup_steps=10)
    >>> for i in range(300):          # log loss falling 0.002 per step
    ...     b.learn(1.0 - 0.002 * i)
    >>> round(b.predict(), 3), round(b.trend, 4)   # next value is 0.4
    (0.4, -0.002)
    >>> round(b.zscore(0.4 + 0.05), 1)  # 5 % above the prediction, in (floored) robust sds
    10.0
    """

    def __init__(self, alpha: float = 0.1, beta: float = 0.1, scale_alpha: float = 0.05,
                 warmup_steps: int = 50, min_scale: float = 0.005, clip: float = 4.0) -> None:
        self.alpha, self.beta, self.scale_alpha = alpha, beta, scale_alpha
        self.warmup_steps, self.min_scale, self.clip = warmup_steps, min_scale, clip
        self.n = 0
        self.level = 0.0
        self.trend = 0.0
        self.mean_abs = 0.0

    @property
    def warm(self) -> bool:
        return self.n >= self.warmup_steps

    def predict(self) -> float:
        return self.level + self.trend

    def sd(self) -> float:
        return max(self.mean_abs * MEAN_ABS_TO_SD, self.min_scale)

    def zscore(self, y: float) -> float:
        """Residual of ``y`` against the prediction in robust standard deviations."""
        if self.n == 0:
            return 0.0
        return (y - self.predict()) / self.sd()

    def learn(self, y: float) -> None:
        if self.n == 0:
            self.level, self.trend, self.mean_abs, self.n = y, 0.0, 0.0, 1
            return
        pred = self.level + self.trend
        r = y - pred
        if self.n >= self.warmup_steps:
            lim = self.clip * self.sd()
            r = min(max(r, -lim), lim)
            a, sa = self.alpha, self.scale_alpha
        else:
            a = max(self.alpha, 1.0 / (self.n + 1))
            sa = max(self.scale_alpha, 1.0 / self.n)
        self.level = pred + a * r
        self.trend = self.trend + a * self.beta * r
        self.mean_abs += sa * (abs(r) - self.mean_abs)
        self.n += 1

    def learn_scale(self, y: float) -> None:
        """Learn only the scale from ``y`` (clipped), leaving level and trend alone: a value judged
        anomalous still says how noisy the series is, so the scale cannot shrink to its floor by
        learning only the values below the threshold."""
        if self.n < 2:
            return
        r = y - (self.level + self.trend)
        lim = self.clip * self.sd()
        self.mean_abs += self.scale_alpha * (min(abs(r), lim) - self.mean_abs)

    def restart(self, y: float) -> None:
        """Re-anchor the level at ``y`` (after a lasting shift), keeping the learned scale."""
        self.level, self.trend = y, 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "level": self.level, "trend": self.trend, "mean_abs": self.mean_abs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])
        self.level, self.trend = float(state["level"]), float(state["trend"])
        self.mean_abs = float(state["mean_abs"])
