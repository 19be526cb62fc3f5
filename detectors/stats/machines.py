"""Block-vectorised state machines: each carries its state from the previous block (``carry``),
so a block of n steps gives exactly what n one-step blocks would."""
from __future__ import annotations

import numpy as np

_MIN_INT64 = np.iinfo(np.int64).min


def hysteresis(enter: np.ndarray, leave: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """State per (row, column): on after an ``enter`` row, off after a ``leave`` row.

    ``enter`` wins when both hold on the same row. Rows with neither keep the previous state;
    ``carry`` (per column) is the state before the first row. Exactly the sequential machine.
    """
    n = enter.shape[0]
    idx = np.arange(n)[:, None]
    last_on = np.maximum.accumulate(np.where(enter, idx, -1), axis=0)
    last_off = np.maximum.accumulate(np.where(leave & ~enter, idx, -1), axis=0)
    # On since the last enter if it is the later; the carried state while neither happened yet
    # (a row cannot be both, so the two are equal only at -1).
    state = last_on > last_off
    state |= (last_off < 0) & carry[None, :]
    return state


def run_length(active: np.ndarray, observed: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """Consecutive observed rows with ``active`` per column, counting from ``carry``.

    An observed row where ``active`` is False resets the count; an unobserved row neither counts
    nor resets (missing is not evidence either way).
    """
    hits = (active & observed).astype(np.int64)
    cum = np.add.accumulate(hits, axis=0)
    cum += carry[None, :]
    reset = observed & ~active
    base = np.maximum.accumulate(np.where(reset, cum, 0), axis=0)
    cum -= base
    return cum


def last_step_where(mask: np.ndarray, steps: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """Per (row, column): the latest step at or before the row where ``mask`` held (else carry)."""
    marked = np.maximum.accumulate(np.where(mask, steps[:, None], _MIN_INT64), axis=0)
    return np.maximum(marked, carry[None, :], out=marked)


def ewma_rows(x: np.ndarray, observed: np.ndarray | None, alpha: float, m0: np.ndarray,
          zero_below: float = 0.0, out: np.ndarray | None = None) -> np.ndarray:
    """Per-column exponentially weighted mean after each row: the (n, r) trajectory.

    ``m = (1 - g) m + g x`` with ``g = alpha`` where observed and 0 elsewhere (a missing cell
    leaves the mean exactly as it was); ``observed=None`` means every cell (a faster path that
    rounds identically). Means below ``zero_below`` become exactly 0. Works in ``x``'s dtype;
    ``x`` is overwritten; ``out`` (x's shape and dtype) receives the trajectory if given.

    >>> ewma_rows(np.array([[1.0], [1.0]]), None, 0.5, np.zeros(1)).ravel().tolist()
    [0.5, 0.75]
    """
    dtype = x.dtype
    out = np.empty(x.shape, dtype=dtype) if out is None else out
    prev = m0.astype(dtype, copy=False)   # only read: the first row is written to ``out``
    keep_rows: np.ndarray
    if observed is None:
        x *= dtype.type(alpha)
        # 1 - alpha as the masked path rounds it, as a row: a ufunc takes an array operand
        # faster than a scalar one, and this loop is the cost of the function.
        keep_rows = np.broadcast_to(_keep_row(x.shape[1], dtype, alpha), x.shape)
    else:
        gain = np.where(observed, dtype.type(alpha), dtype.type(0.0))
        np.copyto(x, 0.0, where=~observed)
        x *= gain
        keep_rows = 1.0 - gain
    multiply, add = np.multiply, np.add
    for row, keep, xi in zip(out, keep_rows, x):   # sequential in steps, vectorised over ranks
        multiply(prev, keep, out=row)
        add(row, xi, out=row)
        if zero_below:
            row[row < zero_below] = 0.0
        prev = row
    return out


_KEEP_ROWS: dict[tuple[int, np.dtype, float], np.ndarray] = {}


def _keep_row(n: int, dtype: np.dtype, alpha: float) -> np.ndarray:
    """``1 - alpha`` (rounded in ``dtype``) repeated ``n`` times, read-only, made once per shape."""
    key = (n, dtype, alpha)
    row = _KEEP_ROWS.get(key)
    if row is None:
        if len(_KEEP_ROWS) > 64:
            _KEEP_ROWS.clear()
        row = np.full(n, dtype.type(1.0) - dtype.type(alpha), dtype=dtype)
        row.flags.writeable = False
        row = _KEEP_ROWS[key] = row
    return row
