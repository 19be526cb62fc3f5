"""Each rank against its peers, judged by the rank's own history: the per-rank view at any world size.

Data-parallel ranks see different micro-batches of one distribution, so a rank's loss or local
gradient norm should sit where its peers' do, up to a *normal offset* (data shards differ, hosts
differ). Comparing a rank with the cross-rank spread of one step does not work for small jobs (the
IQR of 4 values is noise, of 2 it is nothing), and ignores offsets. This module compares each rank
with its own history of deviating from its peers instead:

- ``d[t, r] = y[t, r] - c[t]`` where ``y`` is the log value and ``c[t]`` the cross-rank median of
  step ``t`` (of 2 ranks: their mean, so their deviations mirror each other);
- ``offset[r]``: the rank's normal offset, an exponentially weighted mean of ``d`` (gain
  ``offset_alpha`` per step; a plain running mean over the first ``warmup_steps`` values);
- ``scale[r]``: an exponentially weighted mean of ``|d - offset|`` (gain ``scale_alpha`` per step)
  turned into a standard deviation (x sqrt(pi/2)), floored at ``min_scale``;
- ``z[t, r] = (d - offset) / scale``: how unusual this step is *for this rank*, judged from its
  first ``warmup_steps`` values on.

Both statistics learn every value within ``learn_limit`` of the rank's own sds, clipped at ``clip``
(Huber): a moderately unusual value still counts, so the scale cannot collapse to its floor, and a
wild one (a corrupted replica, a garbage batch) is not learned at all, so a lasting fault is not
absorbed into the rank's "normal". Missing or invalid cells neither count nor move anything.

Cost: offset and scale are held fixed within a period of ``period_steps`` steps (by step number)
and updated at its end from the period's sums (the EWMA gain of that many values), so a block is a
few whole-array passes (float32) instead of a Python loop over its rows; after its warm-up a rank
learns from every ``learn_stride``-th step only (by step number), plenty for memories of 50 to
1,000 values. Because periods are defined by step
numbers and the sums are accumulated in row order, the result is the same however the input is
split into blocks.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> y = rng.normal(0, 0.05, (300, 4)) + np.array([0.0, 0.1, 0.0, -0.1])   # rank offsets
>>> y[250, 2] += 0.7                                                       # one rank jumps 2x
>>> z, rise = PeerDeviation().update(y.astype(np.float32), None, np.arange(300))
>>> int(np.argmax(z[250])), round(float(z[250, 2]), 1), bool(np.abs(z[200]).max() < 4)
(2, 22.3, True)
"""
from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import numpy as np

from detectors.frame import StepBlock
from detectors.stats.cross_section import cross_section
from detectors.stats.rank_table import RankTable
from detectors.stats.trend import MEAN_ABS_TO_SD


class PeerView(NamedTuple):
    """One block of one metric seen through :meth:`PeerDeviation.view` (read-only arrays)."""
    # y, z and rise are work arrays the tracker reuses for the next block: read them during the
    # block's update, copy what must outlive it.
    y: np.ndarray                 # log values, float32 (NaN where invalid)
    valid: np.ndarray | None      # None: every cell valid
    centre: np.ndarray            # cross-rank median of y per row (reference ranks)
    count: np.ndarray             # valid reference cells per row
    z: np.ndarray                 # deviation beyond the usual offset, in the rank's own sds
    rise: np.ndarray              # deviation beyond the usual offset, log units
    z_row_max: np.ndarray         # per row, at least the largest judged z (no NaN): a reader
                                  # after z above a threshold skips the rows at or below it


class PeerDeviation:
    """Per-rank deviation from the cross-rank median, standardised by the rank's own history."""

    def __init__(self, offset_alpha: float = 0.001, scale_alpha: float = 0.02, warmup_steps: int = 50,
                 clip: float = 3.0, learn_limit: float = 6.0, min_scale: float = 0.01,
                 period_steps: int = 16, learn_stride: int = 4) -> None:
        self.offset_alpha, self.scale_alpha = offset_alpha, scale_alpha
        self.warmup_steps, self.clip, self.min_scale = warmup_steps, clip, min_scale
        self.learn_limit, self.period_steps = learn_limit, period_steps
        self.learn_stride = learn_stride
        self.shared = False
        self.reset()

    def reset(self) -> None:
        """Forget everything learned (a new attempt); a shared tracker stays shared."""
        self.table = RankTable({"n": 0, "n_scale": 0, "offset": 0.0, "mean_abs": 0.0,
                                "acc_e": 0.0, "acc_abs": 0.0, "acc_n": 0})
        self._period: int | None = None      # period (step // period_steps) being accumulated
        self._stats_key: tuple | None = None
        self._stats: tuple[np.ndarray, ...] = ()
        # Several detectors may watch the same metric through one tracker (the suite shares it
        # when their settings agree): the view of the last block is kept for the next reader.
        self._last: tuple[weakref.ref, PeerView] | None = None
        self._buffers: dict[str, np.ndarray] = {}

    def params(self) -> tuple:
        return (self.offset_alpha, self.scale_alpha, self.warmup_steps, self.clip, self.learn_limit,
                self.min_scale, self.period_steps, self.learn_stride)

    def view(self, block: StepBlock, metric: str, ref: np.ndarray | None) -> PeerView:
        """The block's metric through this tracker, learning from it once: a second call with
        the same block (another detector sharing the tracker) returns the same view."""
        if self._last is not None and self._last[0]() is block:
            return self._last[1]
        x = block.values[metric]
        y, valid = self.log_values(x, block.present[metric], out=self._buffer("y", x.shape))
        centre, count = self.centre(y, valid, ref)
        z_row_max = np.full(len(y), np.inf)
        z, rise = self.update(y, valid, block.steps, block.ranks, ref, centre=(centre, count),
                              out=(self._buffer("z", x.shape), self._buffer("rise", x.shape)),
                              z_row_max=z_row_max)
        out = PeerView(y, valid, centre, count, z, rise, z_row_max)
        for a in (centre, count, z_row_max):
            a.flags.writeable = False
        self._last = (weakref.ref(block), out)
        return out

    def __repr__(self) -> str:
        return (f"PeerDeviation(offset_alpha={self.offset_alpha}, scale_alpha={self.scale_alpha}, "
                f"warmup_steps={self.warmup_steps}, ranks={len(self.table)})")

    @staticmethod
    def centre(y: np.ndarray, valid: np.ndarray | None, ref: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """``(median, count)`` per row over the valid reference cells (median NaN with none)."""
        if valid is None:
            valid = np.ones(y.shape, dtype=bool)
        c, _, count = cross_section(y, valid, ref, 1, with_scale=False)
        return c, count

    def _buffer(self, name: str, shape: tuple[int, int]) -> np.ndarray:
        """A float32 work array reused from block to block: a fresh megabyte per block costs a
        page fault per 4 KiB, more than the arithmetic done in it."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape:
            buf = self._buffers[name] = np.empty(shape, dtype=np.float32)
        return buf

    def log_values(self, x: np.ndarray, present: np.ndarray,
                   out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """``(log x as float32, valid)``; ``valid`` is None when every cell is reported, finite and
        positive (the usual case, checked with two reductions instead of elementwise masks)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.log(x, dtype=np.float32, out=out)
        # log x is finite exactly where x is positive and finite; one sum tells whether every
        # cell is (an infinity or NaN makes it non-finite; finite logs cannot overflow it).
        if y.size and present.all() and np.isfinite(y.sum()):
            return y, None
        valid = present & np.isfinite(y)
        y[~valid] = np.nan
        return y, valid

    def update(self, y: np.ndarray, valid: np.ndarray | None, steps: np.ndarray,
               ranks: np.ndarray | None = None, ref: np.ndarray | None = None,
               centre: tuple[np.ndarray, np.ndarray] | None = None,
               out: tuple[np.ndarray, np.ndarray] | None = None,
               z_row_max: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(z, rise)`` (rows x ranks, float32) for log values ``y`` at ``steps`` (``valid``
        None: every cell valid), learning from them: ``rise`` is the deviation beyond the rank's
        usual offset (log units), ``z`` that in its own sds. NaN where not judged: invalid cells,
        rows with fewer than 2 valid ranks (or the caller's centre is NaN), and a rank's first
        ``warmup_steps`` values. ``z_row_max``, if given, receives per row an upper bound of
        the largest judged z (it stays as given for rows not judged at all)."""
        n, r = y.shape
        ranks = np.arange(r) if ranks is None else ranks
        c, count = self.centre(y, valid, ref) if centre is None else centre
        row_ok = np.isfinite(c) & (count >= 2)               # one rank has no peers
        pos = self.table.positions(ranks)
        if not row_ok.any():
            nan = np.full((n, r), np.nan, dtype=np.float32)
            return nan, nan.copy()
        ok = None
        if valid is not None or not row_ok.all():
            ok = (np.ones((n, r), dtype=bool) if valid is None else valid) & row_ok[:, None]
        periods = np.asarray(steps, dtype=np.int64) // self.period_steps
        cuts = np.flatnonzero(periods[1:] != periods[:-1]) + 1
        z, rise = out if out is not None else (np.empty((n, r), dtype=np.float32),
                                               np.empty((n, r), dtype=np.float32))
        c32 = c.astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
                self._enter_period(int(periods[a]))
                hi = self._segment(y[a:b], c32[a:b], None if ok is None else ok[a:b], steps[a:b],
                                   pos, ref, z[a:b], rise[a:b])
                if z_row_max is not None:
                    z_row_max[a:b] = hi
        return z, rise

    def _segment(self, y: np.ndarray, c: np.ndarray, ok: np.ndarray | None, steps: np.ndarray,
                 pos: np.ndarray, ref: np.ndarray | None, z: np.ndarray, rise: np.ndarray
                 ) -> np.ndarray:
        """Rows of one period: judge with the period's fixed statistics, accumulate the sums.
        ``ok=None``: every cell valid (the usual case, with fewer passes). Returns per row an
        upper bound of the largest judged z (-inf for a row with none)."""
        t = self.table
        warm, off32, inv32, lim32 = self._period_statistics()
        if len(pos) == len(t) and bool((pos[1:] > pos[:-1]).all()):   # every known rank, in order
            pos = slice(None)             # views instead of gathers and scatters below
        else:
            warm, off32, inv32, lim32 = warm[pos], off32[pos], inv32[pos], lim32[pos]
        all_warm = bool(warm.all())
        np.subtract(y, c[:, None], out=rise)
        rise -= off32
        np.multiply(rise, inv32, out=z)
        # A wild rank (a corrupted replica) drags the median of a small job towards it, so its
        # healthy peers would look off in the other direction: where a row has wild cells, the
        # centre is taken again without them (with 2 ranks: the other rank's value).
        # Two reductions find the rows with a wild cell (NaN, not judged, never counts).
        with np.errstate(invalid="ignore"):
            if ok is None and all_warm:   # no NaN possible: plain reductions
                hi, lo = z.max(axis=1), z.min(axis=1)
            else:
                z_hi = np.where(warm[None, :], z, 0.0) if not all_warm else z
                hi = np.nanmax(z_hi, axis=1, initial=-np.inf)
                lo = np.nanmin(z_hi, axis=1, initial=np.inf)
            hot_rows = np.flatnonzero((hi > self.learn_limit) | (lo < -self.learn_limit))
        if len(hot_rows):
            wild = np.abs(z[hot_rows]) > self.learn_limit
            if ok is not None:
                wild &= ok[hot_rows]
            if not all_warm:
                wild &= warm[None, :]
            keep = ~wild if ok is None else ok[hot_rows] & ~wild
            c2, _, n2 = cross_section(y[hot_rows], keep, ref, 1, with_scale=False)
            c2 = np.where(n2 >= 1, c2, c[hot_rows]).astype(np.float32)
            rise[hot_rows] = y[hot_rows] - c2[:, None] - off32
            z[hot_rows] = rise[hot_rows] * inv32
            hi[hot_rows] = np.nanmax(z[hot_rows], axis=1, initial=-np.inf)
        e = rise
        # Learning: every step while a rank warms up; afterwards every learn_stride-th step,
        # which is plenty for statistics with memories of 50 to 1,000 values.
        if all_warm:
            rows = np.flatnonzero(steps % self.learn_stride == 0)
            e_l, z_l = e[rows], z[rows]
            ok_l = None if ok is None else ok[rows]
        else:
            e_l, z_l, ok_l = e, z, ok
        if len(e_l):
            learn = np.abs(z_l) <= self.learn_limit
            if not all_warm:
                learn |= ~warm[None, :]
            if ok_l is not None:
                learn &= ok_l
            ec = np.minimum(np.maximum(e_l, -lim32), lim32)
            ec[~learn] = 0.0
            acc_e, acc_abs = t["acc_e"][pos], t["acc_abs"][pos]
            for row in ec:                # in row order, so any split of the input sums alike
                acc_e += row
            np.abs(ec, out=ec)
            for row in ec:
                acc_abs += row
            t["acc_e"][pos], t["acc_abs"][pos] = acc_e, acc_abs
            t["acc_n"][pos] += np.count_nonzero(learn, axis=0)
        # Not judged: invalid cells, and ranks still warming up.
        if ok is not None or not all_warm:
            judged = np.broadcast_to(warm[None, :], z.shape) if ok is None else ok & warm[None, :]
            z[~judged] = np.nan
            rise[~judged] = np.nan
        # The maxima took unwarm cells in (as 0, or as themselves in recentred rows): a bound
        # from above of the judged cells' maxima, which is all a reader may rely on.
        return hi

    def _period_statistics(self) -> tuple[np.ndarray, ...]:
        """Per known rank, fixed for the period: warm, and the float32 offset, 1/sd and learning
        clip (computed once per period and rank set, not per block)."""
        key = (self._period, len(self.table))
        if self._stats_key != key:
            t = self.table
            warm = t["n"] >= self.warmup_steps
            sd = np.maximum(t["mean_abs"] * MEAN_ABS_TO_SD, self.min_scale)
            self._stats = (warm, t["offset"].astype(np.float32), (1.0 / sd).astype(np.float32),
                           np.where(warm, self.clip * sd, np.inf).astype(np.float32))
            self._stats_key = key
        return self._stats

    def _enter_period(self, period: int) -> None:
        """Close the period being accumulated (if another): fold its sums into offset and scale."""
        if self._period == period:
            return
        self._period = period
        t = self.table
        k = t["acc_n"]
        if not len(k) or k.max() == 0:
            return
        k_min = int(k.min())
        if k_min == int(k.max()) and int(t["n"].min()) >= self.warmup_steps:
            # The steady state: every rank warm and learned the same number of values, so the
            # gains are scalars.
            kw = k_min * self.learn_stride
            g_off = 1.0 - (1.0 - self.offset_alpha) ** kw
            g_sc = 1.0 - (1.0 - self.scale_alpha) ** kw
            t["offset"] += g_off / k_min * t["acc_e"]
            t["mean_abs"] += g_sc * (t["acc_abs"] / k_min - t["mean_abs"])
            t["n_scale"] += k
            t["n"] += k
            t["acc_e"].fill(0.0)
            t["acc_abs"].fill(0.0)
            t["acc_n"].fill(0)
            return
        has = k > 0
        cnt = t["n"].astype(np.float64)
        kf = k.astype(np.float64)
        total = cnt + kf
        warm = cnt >= self.warmup_steps
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_e = np.where(has, t["acc_e"] / np.maximum(kf, 1.0), 0.0)
            mean_abs_e = np.where(has, t["acc_abs"] / np.maximum(kf, 1.0), 0.0)
            # Running means while warming up; the EWMA gain of k values afterwards.
            # After warm-up a learned value stands for learn_stride steps: the memories stay the
            # same in steps.
            kw = kf * self.learn_stride
            g_off = np.where(warm, 1.0 - (1.0 - self.offset_alpha) ** kw, kf / np.maximum(total, 1.0))
            n_sc = t["n_scale"].astype(np.float64)
            g_sc = np.where(warm, 1.0 - (1.0 - self.scale_alpha) ** kw,
                            np.where(cnt > 0, kf / np.maximum(n_sc + kf, 1.0), 0.0))
        g_off, g_sc = np.where(has, g_off, 0.0), np.where(has, g_sc, 0.0)
        # The scale of a rank's very first period is measured from an offset of 0; it starts
        # counting from the next one (the offset is known by then).
        t["mean_abs"] = t["mean_abs"] + g_sc * (mean_abs_e - t["mean_abs"])
        t["offset"] = t["offset"] + g_off * mean_e
        t["n_scale"] = np.where(has & (cnt > 0), t["n_scale"] + k, t["n_scale"])
        t["n"] = (cnt + kf).astype(t["n"].dtype)
        t["acc_e"], t["acc_abs"] = np.zeros_like(t["acc_e"]), np.zeros_like(t["acc_abs"])
        t["acc_n"] = np.zeros_like(t["acc_n"])

    def state_dict(self) -> dict[str, Any]:
        return {"period": self._period, **self.table.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last = None
        self._stats_key = None
        self._period = state.get("period")
        self.table.load_state_dict({k: v for k, v in state.items() if k != "period"})
