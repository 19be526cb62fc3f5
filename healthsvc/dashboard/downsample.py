"""Server-side downsampling for the dashboard: a few hundred points per curve, whatever the run.

- :func:`lttb` (Largest-Triangle-Three-Buckets, Steinarsson 2013) picks the points of the median
  curve that keep its visual shape: spikes survive, flat stretches thin out.
- :func:`bucket_envelope` takes the min of the mins and the max of the maxes over the same buckets,
  so the per-rank band never hides an outlier that fell between the kept points.
- :func:`rebin_heat` sums a heat grid's step columns into at most ``max_cols`` wider ones.

Example::

    >>> import numpy as np
    >>> x = np.arange(10_000); y = np.sin(x / 500.0); y[4321] = 9.0
    >>> idx = lttb(x, y, 200)
    >>> len(idx), 4321 in idx
    (200, True)
"""
from __future__ import annotations

import numpy as np


def bucket_edges(n: int, n_out: int) -> np.ndarray:
    """Edges of ``n_out - 2`` equal buckets over positions 1..n-2 (first and last kept apart)."""
    return np.linspace(1, n - 1, n_out - 1).astype(np.int64)


def lttb(x: np.ndarray, y: np.ndarray, n_out: int) -> np.ndarray:
    """Indices of ``n_out`` points of (x, y) chosen by LTTB; all indices when ``n_out >= len(x)``.

    NaN values in ``y`` are never chosen over finite ones in their bucket (a bucket that is all
    NaN keeps its first point, so the gap stays visible)."""
    n = len(x)
    if n_out >= n or n <= 2:
        return np.arange(n)
    n_out = max(n_out, 3)
    edges = bucket_edges(n, n_out)
    xf = x.astype(np.float64)
    yf = y.astype(np.float64)
    out = np.empty(n_out, np.int64)
    out[0], out[-1] = 0, n - 1
    a = 0
    for i in range(n_out - 2):
        lo, hi = edges[i], edges[i + 1]
        # The next bucket's average point (or the last point, for the last bucket).
        nlo, nhi = (edges[i + 1], edges[i + 2]) if i + 2 < len(edges) else (n - 1, n)
        ny = yf[nlo:nhi]
        ny = ny[np.isfinite(ny)]
        avg_x = xf[nlo:nhi].mean()
        avg_y = ny.mean() if len(ny) else (yf[a] if np.isfinite(yf[a]) else 0.0)
        ay = yf[a] if np.isfinite(yf[a]) else avg_y
        area = np.abs((xf[a] - avg_x) * (yf[lo:hi] - ay) - (xf[a] - xf[lo:hi]) * (avg_y - ay))
        area = np.where(np.isfinite(area), area, -1.0)
        a = lo + int(np.argmax(area))
        out[i + 1] = a
    return out


def bucket_envelope(lo: np.ndarray, hi: np.ndarray, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Min of ``lo`` and max of ``hi`` over the buckets :func:`lttb` uses (NaN where a bucket has none)."""
    n = len(lo)
    if n_out >= n or n <= 2:
        return lo.copy(), hi.copy()
    n_out = max(n_out, 3)
    edges = bucket_edges(n, n_out)
    starts = np.concatenate([[0], edges[:-1], [n - 1]])
    out_lo, out_hi = np.empty(n_out, lo.dtype), np.empty(n_out, hi.dtype)
    # reduceat over bucket starts; NaN-aware by replacing NaN with +/-inf, then back.
    lo_f = np.where(np.isnan(lo), np.inf, lo)
    hi_f = np.where(np.isnan(hi), -np.inf, hi)
    out_lo[:] = np.minimum.reduceat(lo_f, starts)
    out_hi[:] = np.maximum.reduceat(hi_f, starts)
    out_lo[np.isinf(out_lo) & (out_lo > 0)] = np.nan
    out_hi[np.isinf(out_hi) & (out_hi < 0)] = np.nan
    return out_lo, out_hi


def rebin_heat(sums: np.ndarray, counts: np.ndarray, col_lo: int, col_hi: int,
               max_cols: int) -> tuple[np.ndarray, int]:
    """Mean grid over columns ``col_lo:col_hi`` merged ``k`` at a time so at most ``max_cols``
    remain; returns ``(mean, k)`` with NaN where a cell has no value."""
    s, c = sums[:, col_lo:col_hi], counts[:, col_lo:col_hi]
    k = max(1, -(-s.shape[1] // max(max_cols, 1)))
    if k > 1:
        pad = (-s.shape[1]) % k
        if pad:
            s = np.pad(s, ((0, 0), (0, pad)))
            c = np.pad(c, ((0, 0), (0, pad)))
        s = s.reshape(s.shape[0], -1, k).sum(axis=2)
        c = c.reshape(c.shape[0], -1, k).sum(axis=2)
    with np.errstate(all="ignore"):
        mean = np.where(c > 0, s / np.where(c > 0, c, 1), np.nan)
    return mean, k
