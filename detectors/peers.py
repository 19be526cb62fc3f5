"""Each rank against its peers, judged by the rank's own history: the per-rank view at any world size.

Data-parallel ranks see different micro-batches of one distribution, so a rank's loss or local
gradient norm should sit where its peers' do, up to a *normal offset* (data shards differ, hosts
differ). Comparing a rank with the cross-rank spread of one step does not work for small jobs (the
IQR of 4 values is noise, of 2 it is nothing), and ignores offsets. This module compares each rank
with its own history of deviating from its peers instead:

- ``d[t, r] = y[t, r] - c[t]`` where ``y`` is the log value and ``c[t]`` the cross-rank median of
  step ``t`` (of 2 ranks: their mean, so their deviations mirror each other);
- ``offset[r]``: an exponentially weighted mean of ``d`` (gain ``offset_alpha``; ``1/n`` while the
  first ``warmup_steps`` values come in), the rank's normal offset;
- ``scale[r]``: an exponentially weighted mean of ``|d - offset|`` turned into a standard deviation
  (x sqrt(pi/2)), floored at ``min_scale``;
- ``z[t, r] = (d - offset) / scale`` — how unusual this step is *for this rank*.

Both statistics learn every value within ``learn_limit`` of the rank's own sds, clipped at ``clip``
(Huber): a moderately unusual value still counts, so the scale cannot collapse to its floor, and a
wild one (a corrupted replica, a garbage batch) is not learned at all, so a lasting fault is not
absorbed into the rank's "normal". Learning depends only on the tracker's own state, never on a
detector's decision, so it is exact under any split of the input. Missing or invalid cells
neither count nor move anything.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> y = rng.normal(0, 0.05, (300, 4)) + np.array([0.0, 0.1, 0.0, -0.1])   # rank offsets
>>> y[250, 2] += 0.7                                                       # one rank jumps 2x
>>> z, rise = PeerDeviation().update(y, np.ones_like(y, dtype=bool))
>>> int(np.argmax(z[250])), round(float(z[250, 2]), 1), bool(np.abs(z[200]).max() < 4)
(2, 18.9, True)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from detectors.robust import MEAN_ABS_TO_SD, RankTable, cross_section


class PeerDeviation:
    """Per-rank deviation from the cross-rank median, standardised by the rank's own history."""

    def __init__(self, offset_alpha: float = 0.001, scale_alpha: float = 0.02, warmup_steps: int = 50,
                 clip: float = 3.0, learn_limit: float = 6.0, min_scale: float = 0.01) -> None:
        self.offset_alpha, self.scale_alpha = offset_alpha, scale_alpha
        self.warmup_steps, self.clip, self.min_scale = warmup_steps, clip, min_scale
        self.learn_limit = learn_limit
        self.table = RankTable({"n": 0, "offset": 0.0, "mean_abs": 0.0})

    def __repr__(self) -> str:
        return (f"PeerDeviation(offset_alpha={self.offset_alpha}, scale_alpha={self.scale_alpha}, "
                f"warmup_steps={self.warmup_steps}, ranks={len(self.table)})")

    @staticmethod
    def centre(y: np.ndarray, valid: np.ndarray, ref: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """``(median, count)`` per row over the valid reference cells (median NaN with none)."""
        c, _, count = cross_section(y, valid, ref, 1, with_scale=False)
        return c, count

    def update(self, y: np.ndarray, valid: np.ndarray, ranks: np.ndarray | None = None,
               ref: np.ndarray | None = None,
               centre: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(z, rise)`` (rows x ranks) for log values ``y``, learning from them: ``rise`` is the
        deviation beyond the rank's usual offset (log units), ``z`` that in its own sds. NaN where
        not judged:
        invalid cells, rows with fewer than 2 valid ranks, and a rank's first ``warmup_steps``
        values (its offset and scale are still being learned)."""
        n, r = y.shape
        ranks = np.arange(r) if ranks is None else ranks
        c, count = self.centre(y, valid, ref) if centre is None else centre
        ok = valid & (np.isfinite(c) & (count >= 2))[:, None]   # one rank has no peers
        d = y - c[:, None]
        pos = self.table.positions(ranks)
        cnt = self.table["n"][pos].astype(np.float64)
        off = self.table["offset"][pos].astype(np.float64)
        mabs = self.table["mean_abs"][pos].astype(np.float64)
        z = np.full((n, r), np.nan)
        rise = np.full((n, r), np.nan)
        a_off, a_sc, warm, clip, floor = self.offset_alpha, self.scale_alpha, self.warmup_steps, self.clip, self.min_scale
        with np.errstate(invalid="ignore", divide="ignore"):
            for i in range(n):      # sequential in steps (the state carries), vectorised over ranks
                m = ok[i]
                if not m.any():
                    continue
                e = d[i] - off
                sd = np.maximum(mabs * MEAN_ABS_TO_SD, floor)
                judged = m & (cnt >= warm)
                zi = e / sd
                z[i] = np.where(judged, zi, np.nan)
                rise[i] = np.where(judged, e, np.nan)
                # After warm-up: clipped learning, and none at all from a wild value.
                m = m & ~(judged & (np.abs(zi) > self.learn_limit))
                lim = np.where(cnt >= warm, clip * sd, np.inf)
                ec = np.clip(e, -lim, lim)
                cnt_m = np.where(m, cnt + 1.0, cnt)
                g_off = np.where(m, np.maximum(a_off, 1.0 / np.maximum(cnt_m, 1.0)), 0.0)
                # The scale starts from the second value: the first defines the offset only.
                g_sc = np.where(m & (cnt >= 1), np.maximum(a_sc, 1.0 / np.maximum(cnt, 1.0)), 0.0)
                mabs = mabs + g_sc * (np.abs(ec) - mabs)
                off = off + g_off * ec
                cnt = cnt_m
        self.table["n"][pos] = cnt.astype(self.table["n"].dtype)
        self.table["offset"][pos] = off
        self.table["mean_abs"][pos] = mabs
        return z, rise

    def offsets(self, ranks: np.ndarray) -> np.ndarray:
        """Each rank's learned offset (log units) from its peers."""
        return self.table["offset"][self.table.positions(ranks)].astype(np.float64)

    def state_dict(self) -> dict[str, Any]:
        return self.table.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.table.load_state_dict(state)


def ratio_to_usual(d_minus_offset: float) -> float:
    """A log deviation beyond the usual offset as a ratio (1.0 = where the rank usually sits)."""
    return math.exp(d_minus_offset)
