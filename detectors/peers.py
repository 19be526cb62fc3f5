"""Each rank against its peers, judged by the rank's own history: the per-rank view at any world size.

Data-parallel ranks see different micro-batches of one distribution, so a rank's loss or local
gradient norm should sit where its peers' do, up to a *normal offset* (data shards differ, hosts
differ). Comparing a rank with the cross-rank spread of one step does not work for small jobs (the
IQR of 4 values is noise, of 2 it is nothing), and ignores offsets. This module compares each rank
with its own history of deviating from its peers instead:

- ``d[t, r] = y[t, r] - c[t, r]`` where ``y`` is the log value and ``c[t, r]`` the median of step
  ``t`` over the *other* centre ranks' offset-corrected values ``y - offset`` (leave-one-out: a
  rank never pulls its own centre; of 2 ranks each one's centre is the other, so their
  deviations mirror each other and a finding names the pair). The centre ranks are the
  reference ranks but the current *suspects*: ranks whose ``z`` has averaged past
  ``suspect_z`` (in either direction) over about ``suspicion_steps`` steps, until back below
  half of it, never more than a minority of the ranks. So one corrupted rank, seen or
  being learned, cannot move its healthy peers' centre and make them look low;
- ``offset[r]``: the rank's normal offset, an exponentially weighted mean of ``d`` (gain
  ``offset_alpha`` per step). Over its first ``warmup_steps`` values it is the mean of those
  within ``clip`` sds of their median (the sd from their median absolute deviation), and its
  scale their mean absolute deviation, so a burst during warm-up (a few garbage batches, a
  hiccup of its host) does not become the rank's usual place. After warm-up the offset goes on
  as a running mean of the learned values for as long as that learns faster than the EWMA (a
  few hundred values), so a rank is not left for a thousand steps with the sampling error of
  its first 50 values (a healthy rank's weighted mean z sat near the warning level that way).
  While a rank is a *suspect* (below) its offset does not follow a move: it only goes on
  refining its long-run mean (the running mean of every value it learned), so a lasting fault
  (one rank's loss biased by 5 %) is absorbed at most as m / (n + m) after m more values on n
  learned (about half after as many again: thousands of steps), not within the EWMA's ~1,000
  steps, and the rank stays named while it is corrupted; a healthy rank made a suspect by the
  sampling error of its offset still has that error refined away as before;
- ``scale[r]``: an exponentially weighted mean of ``|d - offset|`` (gain ``scale_alpha`` per step)
  turned into a standard deviation (x sqrt(pi/2)), floored at ``min_scale``;
- ``z[t, r] = (d - offset) / scale``: how unusual this step is *for this rank*, judged from its
  first ``warmup_steps`` values on.

A rank that *joins* a job whose peers are warm (elastic growth, a replaced host) is judged from
its first value against its peers' spread: until its own warm-up is done its offset and scale are
the medians of the warm peers' (not suspects), and then its own median offset is kept only within
the band its peers' offsets span (widened by ``clip`` of their median sds). So a rank that
disagrees from the moment it joins is named, and stays named, instead of learning its
disagreement as its normal place; a newcomer whose offset is like its peers' is not. Ranks that
start together (a new job or attempt) have no warm peers and learn their places from their own
values.

Both statistics learn every value within ``learn_limit`` of the rank's own sds, clipped at ``clip``
(Huber): a moderately unusual value still counts, so the scale cannot collapse to its floor, and a
wild one (a corrupted replica, a garbage batch) is not learned at all, so a lasting fault is not
absorbed into the rank's "normal". Missing or invalid cells neither count nor move anything.

Cost: offset, scale and the suspects are held fixed within a period of ``period_steps`` steps (by step number)
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
(2, 14.8, True)
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, NamedTuple

import numpy as np

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.stats.cross_section import peer_centres
from healthsvc_detectors.stats.rank_table import RankTable
from healthsvc_detectors.stats.state_json import array_from_json, array_to_json
from healthsvc_detectors.stats.trend import MEAN_ABS_TO_SD

# The median absolute deviation of a normal sample times this is its standard deviation.
MAD_TO_SD = 1.4826


# What a finding about a two-rank job says: each rank's only peer is the other, so a deviation
# of one is the opposite deviation of the other, and nothing tells which one moved.
PAIR_NOTE = ("the two ranks disagree; with two ranks there is no majority to tell which one is "
             "off, so both are named")


class PeerView(NamedTuple):
    """One block of one metric seen through :meth:`PeerDeviation.view` (read-only arrays)."""
    # y, z and rise are work arrays the tracker reuses for the next block: read them during the
    # block's update, copy what must outlive it.
    y: np.ndarray                 # log values, float32 (NaN where invalid)
    valid: np.ndarray | None      # None: every cell valid
    centre: np.ndarray            # cross-rank median of y per row (reference ranks)
    # (a field named count shadows tuple.count, which mypy reports; the readers use the name)
    count: np.ndarray  # type: ignore[assignment]  # valid reference cells per row
    z: np.ndarray                 # deviation beyond the usual offset, in the rank's own sds
    rise: np.ndarray              # deviation beyond the usual offset, log units
    z_row_max: np.ndarray         # per row, at least the largest judged z (no NaN): a reader
                                  # after z above a threshold skips the rows at or below it


class PeerDeviation:
    """Per-rank deviation from the cross-rank median, standardised by the rank's own history."""

    def __init__(self, offset_alpha: float = 0.001, scale_alpha: float = 0.02, warmup_steps: int = 50,
                 clip: float = 3.0, learn_limit: float = 6.0, min_scale: float = 0.01,
                 period_steps: int = 16, learn_stride: int = 4, suspect_z: float = 0.5,
                 suspicion_steps: int = 50) -> None:
        self.offset_alpha, self.scale_alpha = offset_alpha, scale_alpha
        self.suspect_z, self.suspicion_steps = suspect_z, suspicion_steps
        self.warmup_steps, self.clip, self.min_scale = warmup_steps, clip, min_scale
        self.learn_limit, self.period_steps = learn_limit, period_steps
        self.learn_stride = learn_stride
        self.shared = False
        self.reset()

    def reset(self) -> None:
        """Forget everything learned (a new attempt); a shared tracker stays shared."""
        self.table = RankTable({"n": 0, "n_scale": 0, "offset": 0.0, "mean_abs": 0.0,
                                "acc_e": 0.0, "acc_abs": 0.0, "acc_n": 0,
                                "suspicion": 0.0, "suspect": False, "acc_z": 0.0, "acc_zn": 0,
                                "prior": False})
        # The deviations of ranks still warming up (warmup_steps x known ranks, by the rank's
        # value count), for their median; None while every rank is warm.
        self._warm_values: np.ndarray | None = None
        self._period: int | None = None      # period (step // period_steps) being accumulated
        self._stats_key: tuple | None = None
        self._stats: tuple[np.ndarray, ...] = ()
        # Several detectors may watch the same metric through one tracker (the suite shares it
        # when their settings agree): the view of the last block is kept for the next reader.
        self._last: tuple[weakref.ref, PeerView] | None = None
        self._buffers: dict[str, np.ndarray] = {}

    def params(self) -> tuple:
        return (self.offset_alpha, self.scale_alpha, self.warmup_steps, self.clip, self.learn_limit,
                self.min_scale, self.period_steps, self.learn_stride, self.suspect_z,
                self.suspicion_steps)

    def view(self, block: StepBlock, metric: str, ref: np.ndarray | None) -> PeerView:
        """The block's metric through this tracker, learning from it once: a second call with
        the same block (another detector sharing the tracker) returns the same view."""
        if self._last is not None and self._last[0]() is block:
            return self._last[1]
        x = block.values[metric]
        y, valid = self.log_values(x, block.present[metric], out=self._buffer("y", x.shape))
        centre, count = np.full(len(y), np.nan), np.zeros(len(y), dtype=np.int64)
        z_row_max = np.full(len(y), np.inf)
        z, rise = self.update(y, valid, block.steps, block.ranks, ref,
                              out=(self._buffer("z", x.shape), self._buffer("rise", x.shape)),
                              z_row_max=z_row_max, centre_out=(centre, count))
        out = PeerView(y, valid, centre, count, z, rise, z_row_max)
        for a in (centre, count, z_row_max):
            a.flags.writeable = False
        self._last = (weakref.ref(block), out)
        return out

    def __repr__(self) -> str:
        return (f"PeerDeviation(offset_alpha={self.offset_alpha}, scale_alpha={self.scale_alpha}, "
                f"warmup_steps={self.warmup_steps}, ranks={len(self.table)})")

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
               out: tuple[np.ndarray, np.ndarray] | None = None,
               z_row_max: np.ndarray | None = None,
               centre_out: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(z, rise)`` (rows x ranks, float32) for log values ``y`` at ``steps`` (``valid``
        None: every cell valid), learning from them: ``rise`` is the deviation beyond the rank's
        usual offset (log units), ``z`` that in its own sds. NaN where not judged: invalid cells,
        rows with fewer than 2 valid centre ranks, and a rank's first ``warmup_steps`` values.
        ``z_row_max``, if given, receives per row an upper bound of the largest judged z (it
        stays as given for rows not judged at all); ``centre_out``, if given, receives per row
        the median of the centre ranks and their count."""
        n, r = y.shape
        ranks = np.arange(r) if ranks is None else ranks
        known = self.table.ids
        pos = self.table.positions(ranks)
        if len(self.table) != len(known):
            self._joined(known)
        periods = np.asarray(steps, dtype=np.int64) // self.period_steps
        cuts = np.flatnonzero(periods[1:] != periods[:-1]) + 1
        z, rise = out if out is not None else (np.empty((n, r), dtype=np.float32),
                                               np.empty((n, r), dtype=np.float32))
        with np.errstate(invalid="ignore", over="ignore"):
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
                self._enter_period(int(periods[a]))
                hi, med, count = self._segment(y[a:b], None if valid is None else valid[a:b],
                                               steps[a:b], pos, ref, z[a:b], rise[a:b])
                if z_row_max is not None:
                    z_row_max[a:b] = hi
                if centre_out is not None:
                    centre_out[0][a:b], centre_out[1][a:b] = med, count
        return z, rise

    def _segment(self, y: np.ndarray, valid: np.ndarray | None, steps: np.ndarray,
                 pos: np.ndarray, ref: np.ndarray | None, z: np.ndarray, rise: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows of one period: judge with the period's fixed statistics, accumulate the sums.
        ``valid=None``: every cell valid (the usual case, with fewer passes). Returns per row an
        upper bound of the largest judged z (-inf for a row with none), the median of the
        centre ranks and their count."""
        t = self.table
        n, r = y.shape
        # warm: the rank has learned its place (its statistics are its own); judge: it is judged
        # (warm, or a newcomer judged by its peers' statistics meanwhile).
        warm, judge, off32, inv32, lim32, suspect = self._period_statistics()
        sel: np.ndarray | slice = pos   # or slice(None): every known rank, in order
        if len(pos) == len(t) and bool((pos[1:] > pos[:-1]).all()):   # every known rank, in order
            sel = slice(None)             # views instead of gathers and scatters below
        else:
            warm, judge, off32, inv32, lim32, suspect = (warm[sel], judge[sel], off32[sel], inv32[sel],
                                                         lim32[sel], suspect[sel])
        all_warm = bool(warm.all())
        all_judged = all_warm or bool(judge.all())
        # The centre ranks: the reference ranks but the current suspects, so one corrupted rank
        # cannot move its healthy peers' centre; each of them is judged against the others.
        cols = np.arange(r) if ref is None else np.asarray(ref)
        if suspect.any():
            cols = cols[~suspect[cols]]
        med, count = self._deviation(y, valid, cols, off32, rise)
        ok = valid
        row_ok = np.isfinite(med) & (count >= 2)               # one rank has no peers
        if not row_ok.all():
            ok = (np.ones((n, r), dtype=bool) if ok is None else ok) & row_ok[:, None]
        np.multiply(rise, inv32, out=z)
        # A wild rank (a corrupted replica not yet a suspect) would still move the centre of its
        # peers in a small job: where a row has wild cells, the centre is taken again without
        # them. Two reductions find the rows with a wild cell (NaN, not judged, never counts).
        with np.errstate(invalid="ignore"):
            if ok is None and all_judged:   # no NaN possible: plain reductions
                hi, lo = z.max(axis=1), z.min(axis=1)
            else:
                z_hi = np.where(judge[None, :], z, 0.0) if not all_judged else z
                hi = np.nanmax(z_hi, axis=1, initial=-np.inf)
                lo = np.nanmin(z_hi, axis=1, initial=np.inf)
            hot_rows = np.flatnonzero((hi > self.learn_limit) | (lo < -self.learn_limit))
        if len(hot_rows):
            # Wild by the median of all ranks, which one wild rank cannot move (the median of the
            # others can, in a job of three: it is the mean of two).
            z_all = (y[hot_rows] - off32 - med.astype(np.float32)[hot_rows, None]) * inv32
            wild = np.abs(z_all) > self.learn_limit
            if ok is not None:
                wild &= ok[hot_rows]
            if not all_judged:
                wild &= judge[None, :]
            keep = ~wild if ok is None else ok[hot_rows] & ~wild
            rise_h = np.empty((len(hot_rows), r), dtype=np.float32)
            _, n2 = self._deviation(y[hot_rows], keep, cols, off32, rise_h, keep_only=True)
            redo = n2 >= 2
            hot_rows, rise_h = hot_rows[redo], rise_h[redo]
            rise[hot_rows] = rise_h
            z[hot_rows] = rise_h * inv32
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
            if not all_warm:
                self._keep_warm_values(e_l, learn, off32, warm, sel)
            ec = np.minimum(np.maximum(e_l, -lim32), lim32)
            ec[~learn] = 0.0
            acc_e, acc_abs = t["acc_e"][sel], t["acc_abs"][sel]
            for row in ec:                # in row order, so any split of the input sums alike
                acc_e += row
            np.abs(ec, out=ec)
            for row in ec:
                acc_abs += row
            t["acc_e"][sel], t["acc_abs"][sel] = acc_e, acc_abs
            t["acc_n"][sel] += np.count_nonzero(learn, axis=0)
        # Not judged: invalid cells, and ranks still warming up (but newcomers judged by their peers).
        judged = None
        if ok is not None or not all_judged:
            judged = np.broadcast_to(judge[None, :], z.shape) if ok is None else ok & judge[None, :]
            z[~judged] = np.nan
            rise[~judged] = np.nan
        # Only the reference ranks can be centre ranks, so only they need a suspicion.
        ref_cols = np.arange(r) if ref is None else np.asarray(ref)
        at = ref_cols if isinstance(sel, slice) else sel[ref_cols]
        self._accumulate_suspicion(z[:, ref_cols], None if judged is None else judged[:, ref_cols], at)
        # The maxima took unwarm cells in (as 0, or as themselves in recentred rows): a bound
        # from above of the judged cells' maxima, which is all a reader may rely on.
        return hi, med, count

    @staticmethod
    def _deviation(y: np.ndarray, valid: np.ndarray | None, cols: np.ndarray, off32: np.ndarray,
                   rise: np.ndarray, keep_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Fill ``rise`` with each cell's value beyond its rank's usual offset minus its centre:
        for a centre rank the median of the other centre ranks', for any other rank the median
        of all of theirs. The centre is of offset-corrected values, so a rank's usual place
        (learned, or a lasting fault being learned) does not move its peers' centre either.
        ``keep_only``: ``valid`` marks the cells that make the centre, and the others (wild
        cells) are judged against it too. Returns the per-row median and count."""
        np.subtract(y, off32, out=rise)
        centre = _as_slice(cols)
        med, loo, count = peer_centres(rise, valid, centre)
        med32 = med.astype(np.float32)[:, None]
        if keep_only:
            assert valid is not None   # keep_only comes with the cells to keep
            loo = np.where(valid[:, centre], loo, med32)
        # Every cell minus the median, then the centre ranks' cells moved to their own centre:
        # one contiguous pass and one gather of the (at most max_reference_ranks) centre columns.
        rise -= med32
        if loo.shape[1]:
            rise[:, centre] += med32 - loo
        return med, count

    def _accumulate_suspicion(self, z: np.ndarray, judged: np.ndarray | None,
                              pos: np.ndarray | slice) -> None:
        """Add the judged z of the rows (clipped at ``learn_limit``; ``judged=None``: every cell)
        to the period's suspicion sums. Rounded to 1/1024 of an sd, so the sums are of small
        integers, exact in float32 and in any order: any split of the input sums alike."""
        zq = self._buffer("zq", z.shape)
        lim = self.learn_limit * 1024.0
        np.multiply(z, 1024.0, out=zq)
        np.rint(zq, out=zq)
        np.minimum(zq, lim, out=zq)
        np.maximum(zq, -lim, out=zq)
        t = self.table
        if judged is not None:
            zq[~judged] = 0.0
            t["acc_zn"][pos] += np.count_nonzero(judged, axis=0)
        else:
            t["acc_zn"][pos] += len(z)
        t["acc_z"][pos] += zq.sum(axis=0) / 1024.0

    def _period_statistics(self) -> tuple[np.ndarray, ...]:
        """Per known rank, fixed for the period: warm, judged, and the float32 offset, 1/sd and
        learning clip (computed once per period and rank set, not per block)."""
        key = (self._period, len(self.table))
        if self._stats_key != key:
            t = self.table
            warm = t["n"] >= self.warmup_steps
            sd = np.maximum(t["mean_abs"] * MEAN_ABS_TO_SD, self.min_scale)
            self._stats = (warm, warm | t["prior"], t["offset"].astype(np.float32),
                           (1.0 / sd).astype(np.float32),
                           np.where(warm, self.clip * sd, np.inf).astype(np.float32),
                           t["suspect"].copy())
            self._stats_key = key
        return self._stats

    def _enter_period(self, period: int) -> None:
        """Close the period being accumulated (if another): fold its sums into offset and scale."""
        if self._period == period:
            return
        self._period = period
        t = self.table
        # The period's suspects (before the closed period names the next ones): their offset
        # only refines its long-run mean, it does not follow the move (module doc).
        held = t["suspect"].copy() if len(t) else t["suspect"]
        self._update_suspects()
        k = t["acc_n"]
        if not len(k) or k.max() == 0:
            return
        k_min = int(k.min())
        if k_min == int(k.max()) and int(t["n"].min()) >= self.warmup_steps:
            # The steady state: every rank warm and learned the same number of values, so the
            # gains are scalars.
            kw_all = k_min * self.learn_stride
            ewma_off = 1.0 - (1.0 - self.offset_alpha) ** kw_all
            g_sc_all = 1.0 - (1.0 - self.scale_alpha) ** kw_all
            # A running mean for as long as it learns faster than the EWMA (see the module doc);
            # only the running mean for a suspect.
            running = k_min / (t["n"] + k_min)
            g_off = np.where(held, running, np.maximum(ewma_off, running))
            t["offset"] += g_off / k_min * t["acc_e"]
            t["mean_abs"] += g_sc_all * (t["acc_abs"] / k_min - t["mean_abs"])
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
            running = kf / np.maximum(total, 1.0)
            g_off = np.where(warm & ~held, np.maximum(1.0 - (1.0 - self.offset_alpha) ** kw, running), running)
            n_sc = t["n_scale"].astype(np.float64)
            g_sc = np.where(warm, 1.0 - (1.0 - self.scale_alpha) ** kw,
                            np.where(cnt > 0, kf / np.maximum(n_sc + kf, 1.0), 0.0))
        g_off, g_sc = np.where(has, g_off, 0.0), np.where(has, g_sc, 0.0)
        before = (t["offset"].copy(), t["mean_abs"].copy())
        # The scale of a rank's very first period is measured from an offset of 0; it starts
        # counting from the next one (the offset is known by then).
        t["mean_abs"] = t["mean_abs"] + g_sc * (mean_abs_e - t["mean_abs"])
        t["offset"] = t["offset"] + g_off * mean_e
        t["n_scale"] = np.where(has & (cnt > 0), t["n_scale"] + k, t["n_scale"])
        t["n"] = (cnt + kf).astype(t["n"].dtype)
        t["acc_e"], t["acc_abs"] = np.zeros_like(t["acc_e"]), np.zeros_like(t["acc_abs"])
        t["acc_n"] = np.zeros_like(t["acc_n"])
        self._settle_warm_up(has & ~warm, warm, *before)

    # --------------------------------------------------------------------------- warm-up
    def _joined(self, known: np.ndarray) -> None:
        """Ranks just added to the table (``known``: the ids before): make room for their warm-up
        values, and when warm peers exist judge them by their peers' statistics until their own
        warm-up is done."""
        t = self.table
        new = ~np.isin(t.ids, known)
        if self._warm_values is not None:
            at = np.searchsorted(known, t.ids[new])
            self._warm_values = np.insert(self._warm_values, at, np.nan, axis=1)
        peers = ~new & (t["n"] >= self.warmup_steps) & ~t["suspect"]
        if peers.any():
            t["offset"][new] = np.median(t["offset"][peers])
            t["mean_abs"][new] = np.median(t["mean_abs"][peers])
            t["prior"][new] = True
        self._stats_key = None

    def _keep_warm_values(self, e: np.ndarray, learn: np.ndarray, off32: np.ndarray,
                          warm: np.ndarray, pos: np.ndarray | slice) -> None:
        """Store the learned deviations (``e`` beyond the offset, plus it) of the ranks still
        warming up at their value count: up to ``warmup_steps`` values a rank, for the median."""
        cold = np.flatnonzero(~warm)
        rows = cold if isinstance(pos, slice) else pos[cold]
        t = self.table
        if self._warm_values is None:
            self._warm_values = np.full((self.warmup_steps, len(t)), np.nan, dtype=np.float32)
        lc = learn[:, cold]
        index = (t["n"][rows] + t["acc_n"][rows])[None, :] + np.cumsum(lc, axis=0) - 1
        i, j = np.nonzero(lc & (index < self.warmup_steps))
        self._warm_values[index[i, j], rows[j]] = e[i, cold[j]] + off32[cold[j]]

    def _settle_warm_up(self, cold: np.ndarray, warm: np.ndarray, offset: np.ndarray,
                        mean_abs_before: np.ndarray) -> None:
        """After a period, the ranks that were warming up (``cold``; ``warm``: the ranks warm
        before it; ``offset``, ``mean_abs_before``: the statistics before it). Those that have
        now learned ``warmup_steps`` values take the robust place of them (:func:`_robust_place`);
        a newcomer's is kept within the band of its warm peers' offsets. Until then a newcomer
        judged by its peers keeps their statistics, and the others the running means (they are
        not judged yet; computed once per rank, the robust place costs nothing per step)."""
        t = self.table
        if cold.any() and self._warm_values is not None:
            prior = t["prior"]
            keep = cold & prior & (t["n"] < self.warmup_steps)    # still judged by its peers
            t["offset"][keep], t["mean_abs"][keep] = offset[keep], mean_abs_before[keep]
            done = np.flatnonzero(cold & (t["n"] >= self.warmup_steps))
            if len(done):
                mean, spread = _robust_place(self._warm_values[:, done], self.clip, self.min_scale)
                peers = warm & ~t["suspect"] & ~cold
                newcomer = prior[done]
                if newcomer.any() and peers.any():
                    centre = float(np.median(t["offset"][peers]))
                    sd = np.maximum(t["mean_abs"][peers] * MEAN_ABS_TO_SD, self.min_scale)
                    half = float(np.abs(t["offset"][peers] - centre).max()) + self.clip * float(np.median(sd))
                    mean = np.where(newcomer, np.clip(mean, centre - half, centre + half), mean)
                t["offset"][done], t["mean_abs"][done] = mean, spread
                t["n_scale"][done] = t["n"][done]
                t["prior"][done] = False
        if self._warm_values is not None and bool((t["n"] >= self.warmup_steps).all()):
            self._warm_values = None

    def _update_suspects(self) -> None:
        """Fold the closed period's mean z into each rank's suspicion (an exponentially weighted
        mean with a memory of ``suspicion_steps`` steps) and name the suspects of the next
        period: past ``suspect_z`` in either direction, until back below half of it; never more
        than a minority of the known ranks (the most extreme first), since with no majority
        left there is no centre to judge by (a pair of ranks has no suspect)."""
        t = self.table
        n = t["acc_zn"]
        if not len(n) or n.max() == 0:
            return
        g = 1.0 - (1.0 - 1.0 / self.suspicion_steps) ** self.period_steps
        # Ranks with no judged value this period keep their suspicion (their sums are 0).
        step = g * (t["acc_z"] / np.maximum(n, 1) - t["suspicion"])
        step[n == 0] = 0.0
        t["suspicion"] += step
        t["acc_z"].fill(0.0)
        n.fill(0)
        size = np.abs(t["suspicion"])
        suspect = size > np.where(t["suspect"], self.suspect_z / 2, self.suspect_z)
        cap = (len(t) - 1) // 2
        if suspect.sum() > cap:
            order = np.argsort(-np.where(suspect, size, -1.0), kind="stable")
            suspect = np.zeros_like(suspect)
            suspect[order[:cap]] = True
        if (suspect != t["suspect"]).any():
            t["suspect"] = suspect
            self._stats_key = None

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"period": self._period, **self.table.state_dict()}
        if self._warm_values is not None:
            out["warm_values"] = [array_to_json(row) for row in self._warm_values]
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last = None
        self._stats_key = None
        self._period = state.get("period")
        self.table.load_state_dict({k: v for k, v in state.items() if k not in ("period", "warm_values")})
        rows = state.get("warm_values")
        self._warm_values = (None if rows is None else
                             np.array([array_from_json(r, np.dtype(np.float32)) for r in rows],
                                      dtype=np.float32).reshape(len(rows), len(self.table)))


def _robust_place(values: np.ndarray, clip: float, min_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per column of ``values`` (a rank's warm-up deviations; NaN: none): the mean of the values
    within ``clip`` sds of their median (the sd from their median absolute deviation, floored at
    ``min_scale``) and their mean absolute deviation from it. As steady as a mean, and what lies
    beyond (a burst) is not learned, as after warm-up.

    >>> v = np.array([[0.0], [0.1], [-0.1], [0.05], [3.0]])
    >>> [round(float(a[0]), 3) for a in _robust_place(v, 3.0, 0.01)]
    [0.013, 0.062]
    """
    v = values.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # a column with no value at all
        median = np.nanmedian if np.isnan(v).any() else np.median
        med = median(v, axis=0)
        sd = np.maximum(median(np.abs(v - med), axis=0) * MAD_TO_SD, min_scale)
    with np.errstate(invalid="ignore", divide="ignore"):
        near = np.abs(v - med) <= clip * sd          # NaN compares False
        count = near.sum(axis=0)
        mean = np.where(near, v, 0.0).sum(axis=0) / count
        spread = np.where(near, np.abs(v - mean), 0.0).sum(axis=0) / count
    return mean, spread


def _as_slice(cols: np.ndarray) -> np.ndarray | slice:
    """Columns in a regular stride (the reference ranks of a block in rank order, the usual case)
    as a slice: a view of them instead of a gather and a scatter."""
    if len(cols) >= 2:
        step = int(cols[1] - cols[0])
        if step > 0 and bool((np.diff(cols) == step).all()):
            return slice(int(cols[0]), int(cols[-1]) + 1, step)
    return cols

