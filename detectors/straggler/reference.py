"""The straggler detector's yardstick: which timing tells ranks apart, and the peers' median.

Per step, one source of timing for every rank (``compute_time``, else ``step_time - comm_time``,
else ``step_time`` where the ranks are not in lockstep; :data:`SOURCES`), and the peer median and
robust relative spread of a fixed, id-ordered subset of at most ``max_reference_ranks`` ranks.
The maths is in :mod:`healthsvc_detectors.straggler.detector`.
"""
from __future__ import annotations

import numpy as np

from healthsvc_detectors.frame import StepBlock

SOURCES: tuple[str, ...] = ("compute_time", "comm_time", "step_time")


class StragglerReference:
    """The timings and the peer reference of
    :class:`~healthsvc_detectors.straggler.detector.StragglerDetector` (its ``min_ranks``, ``sync_spread``,
    ``max_reference_ranks`` and ``scale_floor``; the cached subset ``_ref_cols``)."""

    # Declared for the type checker; the detector sets them.
    min_ranks: int
    sync_spread: float
    max_reference_ranks: int
    scale_floor: float
    _ref_cols: np.ndarray | None

    def _timings(self, block: StepBlock) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Per-value timing ``V`` (seconds), its validity mask (``None``: all valid), and each step's source index.

        One source per step, so every rank is compared with peers measured the same way
        (``step_time - comm_time`` also holds the data wait; mixing it with ``compute_time``
        would make the ranks that lack ``compute_time`` look slow). ``None`` = all compute_time.
        """
        vals, pres = block.values, block.present
        n, r = block.n_steps, block.n_ranks
        c = vals.get("compute_time")
        # The common, fast case: every rank reported a positive, finite compute time
        # (min/max propagate NaN, so two reductions check it without temporaries).
        if c is not None and pres["compute_time"].all() and c.min() > 0 and c.max() < np.inf:
            return c, None, None
        v, ok = np.full((n, r), np.nan), np.zeros((n, r), dtype=bool)
        src = np.zeros(n, dtype=np.int8)
        todo = np.ones(n, dtype=bool)   # steps still without a source
        if c is not None:
            c_ok = pres["compute_time"] & (c > 0) & np.isfinite(c)
            rows = c_ok.sum(axis=1) >= self.min_ranks
            v[rows], ok[rows], todo = c[rows], c_ok[rows], ~rows
        st = vals.get("step_time")
        if st is not None and todo.any():
            st_ok = pres["step_time"] & (st > 0) & np.isfinite(st)
            if "comm_time" in vals:
                with np.errstate(invalid="ignore"):   # whatever sits in absent cells
                    comp = st - vals["comm_time"]
                comp_ok = st_ok & pres["comm_time"] & (comp > 0) & np.isfinite(comp)
                rows = todo & (comp_ok.sum(axis=1) >= self.min_ranks)
                v[rows], ok[rows], src[rows], todo = comp[rows], comp_ok[rows], 1, todo & ~rows
            rows = todo & self._asynchronous_rows(np.where(st_ok, st, np.nan), st_ok)
            v[rows], ok[rows], src[rows] = st[rows], st_ok[rows], 2
        return v, ok, src

    def _asynchronous_rows(self, st: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Steps whose step_time spread ``(max - min) / median`` says ranks are not in lockstep."""
        out = np.zeros(len(st), dtype=bool)
        for i in range(len(st)):   # only reached without compute_time; steps, not ranks
            row = st[i, ok[i]]
            if len(row) >= self.min_ranks:
                out[i] = (row.max() - row.min()) / np.median(row) > self.sync_spread
        return out

    def _reference(self, v: np.ndarray, ok: np.ndarray | None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Per-step peer median (s), relative robust scale, and usable steps (None = all)."""
        r = v.shape[1]
        m = self.max_reference_ranks
        if r <= m:
            ref, ref_ok = v, ok
        else:
            if self._ref_cols is None or self._ref_cols[-1] != r - 1:
                self._ref_cols = np.linspace(0, r - 1, m).astype(np.int64)
            ref = v[:, self._ref_cols]
            ref_ok = None if ok is None else ok[:, self._ref_cols]
        usable = None
        # The order statistics come from float32 copies: numpy sorts float32 with SIMD, several
        # times faster than float64 at 512 peers, and a median rounded to 7 digits moves
        # a ratio by less than 1e-7 (the noise floor of the scale is 5e-3). Every path rounds
        # the same way, so block boundaries still do not change results.
        if ref_ok is None or ref_ok.all():
            if ref.shape[1] < self.min_ranks:
                return np.ones(len(v)), np.ones(len(v)), np.zeros(len(v), dtype=bool)
            srt = np.sort(ref.astype(np.float32), axis=1)
            m = srt.shape[1]
            if len(srt) == 1:
                # The streaming case: Python floats beat a dozen tiny numpy calls (same IEEE
                # arithmetic as the vector path, so block boundaries do not change results).
                row = srt[0]
                med1 = 0.5 * (float(row[(m - 1) // 2]) + float(row[m // 2]))
                iqr1 = float(row[(3 * (m - 1)) // 4]) - float(row[(m - 1) // 4])
                return np.array([med1]), np.array([max(iqr1 / 1.349 / med1, self.scale_floor)]), None
            med, iqr = _quantiles(srt, m)
        else:
            n = len(v)
            med, iqr, usable = np.ones(n), np.zeros(n), np.zeros(n, dtype=bool)
            for i in range(n):   # rows with missing ranks: steps, not ranks
                row = np.sort(ref[i, ref_ok[i]].astype(np.float32))
                if len(row) >= self.min_ranks:
                    mi, qi = _quantiles(row[None, :], len(row))
                    med[i], iqr[i], usable[i] = mi[0], qi[0], True
        scale = np.maximum(iqr / 1.349 / med, self.scale_floor)
        return med, scale, usable


def _quantiles(sorted_rows: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Median and inter-quartile range (float64) of each row of an ascending-sorted ``(n, m)``
    array: the same arithmetic on the same values as the one-row path of ``_reference``."""
    lo, hi = (m - 1) // 2, m // 2
    med = 0.5 * (sorted_rows[:, lo].astype(np.float64) + sorted_rows[:, hi])
    iqr = (sorted_rows[:, (3 * (m - 1)) // 4].astype(np.float64)
           - sorted_rows[:, (m - 1) // 4])
    return med, iqr
