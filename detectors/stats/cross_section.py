"""Per-step centre (median) and scale (IQR / 1.349, a robust standard deviation) across ranks.

Estimated on at most ``max_ranks`` ranks chosen by rank id, so the cost stays flat at 16k ranks
and a permutation of the columns changes nothing.
"""
from __future__ import annotations

import functools

import numpy as np

# IQR of a normal distribution in standard deviations.
IQR_TO_SD = 1.0 / 1.3489795003921634


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


def peer_centres(y: np.ndarray, valid: np.ndarray | None, cols: np.ndarray | slice
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row the median of the valid cells of ``y[:, cols]`` (the *centre ranks*) and, for each
    of those columns, the median of the others (leave-one-out), so a rank never pulls its own
    centre: ``(median (n,), loo (n, len(cols)), count (n,))``.

    ``valid=None``: every cell is valid. A row with no valid centre cell has a NaN median; a
    centre cell with no other valid centre cell in its row has a NaN leave-one-out median. Both
    come from one row sort: removing one value from ``k`` sorted values moves the median to one
    of its two neighbours (``k`` even) or to the mean of a neighbour pair (``k`` odd).

    >>> y = np.array([[1.0, 2.0, 3.0, 10.0]])
    >>> med, loo, k = peer_centres(y, None, np.arange(4))
    >>> float(med[0]), loo[0].tolist(), int(k[0])
    (2.5, [3.0, 3.0, 2.0, 2.0], 4)
    """
    ys = y[:, cols]
    n, m = ys.shape
    if m == 0:
        return np.full(n, np.nan), np.full((n, 0), np.nan), np.zeros(n, dtype=np.int64)
    if valid is None or valid[:, cols].all():
        # The usual case: every row holds m values, so the neighbours are fixed columns.
        srt, k = np.sort(ys, axis=1), np.full(n, m, dtype=np.int64)
        if m == 1:
            return srt[:, 0].astype(np.float64), np.full((n, 1), np.nan), k
        h = m // 2
        if m % 2 == 0:
            below, mid = srt[:, h - 1:h], srt[:, h:h + 1]
            return ((below + mid) / 2)[:, 0].astype(np.float64), np.where(ys <= below, mid, below), k
        below, mid, above = srt[:, h - 1:h], srt[:, h:h + 1], srt[:, h + 1:h + 2]
        loo = np.where(ys < mid, (mid + above) / 2, (below + mid) / 2)
        loo[ys == mid] = ((below + above) / 2)[np.nonzero(ys == mid)[0], 0]
        return mid[:, 0].astype(np.float64), loo, k
    vs = valid[:, cols]
    srt, k = np.sort(np.where(vs, ys, np.nan), axis=1), vs.sum(axis=1)   # NaN sorts last
    rows = np.arange(n)

    def at(j: np.ndarray) -> np.ndarray:
        return srt[rows, np.clip(j, 0, m - 1)][:, None]

    h = k // 2
    odd = (k % 2 == 1)[:, None]
    below, mid, above = at(h - 1), at(h), at(h + 1)          # odd k: the middle and its neighbours
    med = np.where(odd[:, 0], mid[:, 0], (below[:, 0] + mid[:, 0]) / 2)   # even k: below, mid
    med[k == 0] = np.nan
    with np.errstate(invalid="ignore"):
        loo_even = np.where(ys <= below, mid, below)
        loo_odd = np.where(ys < mid, (mid + above) / 2, np.where(ys > mid, (below + mid) / 2,
                                                                 (below + above) / 2))
    loo = np.where(odd, loo_odd, loo_even)
    loo[k <= 1] = np.nan
    return med.astype(np.float64), loo, k
