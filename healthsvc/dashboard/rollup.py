"""A run's dashboard rollup: small per-step aggregates, kept up to date as aligned steps arrive.

The run page must open in well under 2 s even for 16,384 ranks x 10,000 steps (164 M records), so
it never reads the raw history. Instead each complete step (a :class:`healthsvc_detectors.StepBlock` row, as
the step aligner emits it) is folded into:

- **lines**: for each of :data:`LINE_FIELDS`, the cross-rank median, min and max of the finite
  values, and the count of non-finite values (NaN/±Inf are data: they are counted, never dropped
  silently and never mixed into the median). One float32 per statistic per step: 10,000 steps of
  three fields is under 1 MB.
- **heat**: for each of :data:`HEAT_FIELDS`, a rank-bins x step-bins grid of the value relative to
  the step's cross-rank median (``compute_time / median``: 2.0 is "twice as slow as its peers",
  so a straggler stands out whatever the job's own speed). A rank bin holds ``rank_width`` ranks
  and keeps their *maximum* ratio (one slow rank among 64 must not be averaged away); a step bin
  holds ``step_width`` steps and keeps the *mean* over them (sum and count). The grid holds the
  rows its ranks need (a power of two: 64 for 64 ranks) and is capped at :data:`MAX_RANK_BINS` x
  :data:`MAX_STEP_BINS`: when a run outgrows it the widths double and neighbouring bins merge, so
  memory stays bounded (at most 4 MB per field) for any run length.

A new attempt (a restart or rollback resuming at step ``s``) truncates everything from ``s`` on:
the effective history is the newest attempt, as everywhere else in the service.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import blosc2
import numpy as np

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.offline.onset_signals import row_median

LINE_FIELDS = ("loss", "grad_norm", "step_time")
HEAT_FIELDS = ("compute_time", "step_time")
STATS = ("median", "min", "max", "nonfinite", "reported")
MAX_RANK_BINS = 256
MAX_STEP_BINS = 2048  # 5x the 400 columns the page shows: zooming in keeps detail
_GROW = 1024  # steps added at a time to the line arrays


_NO_RANK = -1.0   # a heat cell no rank reported, before the bins' max (ratios are positive)


def _median_of_rows(v: np.ndarray) -> np.ndarray:
    """``np.median(v, axis=1)`` of a block with no missing value, the same numbers. np.median
    partitions each row on both middle positions at once, which numpy does slowly for many rows
    (a 16 x 1,024 block: 300 us); one partition on the upper middle puts everything not above it
    to its left, whose largest value is the lower middle (30 us for the same block)."""
    n = v.shape[1]
    if n <= 2:
        return v.mean(axis=1) if n == 2 else v[:, 0].astype(np.float64)
    hi = n // 2
    part = np.partition(v, hi, axis=1)
    if n % 2:
        return part[:, hi]
    return (part[:, :hi].max(axis=1) + part[:, hi]) / 2


def _max_of_bins(x: np.ndarray) -> np.ndarray:
    """``x.max(axis=2)`` (each bin's ranks), as elementwise maxima over whole arrays: numpy
    reduces a short last axis cell by cell (16 steps x 256 bins of 4 ranks: 158 us). A wide bin
    is halved first (log2 steps), then its last few columns are taken one by one into the result
    (16 x 256 x 4: 10 us, where halving all the way cost 44: each halved array is a copy with an
    inner axis of two). The same numbers (a NaN propagates through both)."""
    width = x.shape[2]
    while width > 8 and width % 2 == 0:
        half = width // 2
        x = np.maximum(x[:, :, :half], x[:, :, half:])
        width = half
    if width == 1:
        return x[:, :, 0]
    out = np.maximum(x[:, :, 0], x[:, :, 1])
    for j in range(2, width):
        np.maximum(out, x[:, :, j], out=out)
    return out


def _grown(a: np.ndarray, rows: int | None = None, cols: int | None = None) -> np.ndarray:
    """``a`` copied into the top left of a zero array of ``rows`` x ``cols`` (its own where not
    given)."""
    out = np.zeros((a.shape[0] if rows is None else rows, a.shape[1] if cols is None else cols), a.dtype)
    out[:a.shape[0], :a.shape[1]] = a
    return out


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, int(np.ceil(np.log2(max(x, 1)))))


@dataclass
class HeatGrid:
    """The rank-bins x step-bins grid of one field (see module docstring)."""
    rank_width: int = 1
    step_width: int = 1
    # Rows as the run's ranks need them (a power of two, at most MAX_RANK_BINS): a run of 64
    # ranks holds 64 rows, not 256, so its grid costs a quarter to hold, grow and snapshot.
    sums: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))

    def fit_ranks(self, n_ranks: int) -> None:
        """Widen rank bins (merging neighbours, max of means) until ``n_ranks`` fit in
        MAX_RANK_BINS rows, then add the rows they need."""
        while n_ranks > MAX_RANK_BINS * self.rank_width:
            rows = len(self.sums) + len(self.sums) % 2   # pairs of rows merge
            sums, counts = _grown(self.sums, rows), _grown(self.counts, rows)
            mean = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
            m = np.maximum(mean[0::2], mean[1::2])
            c = np.maximum(counts[0::2], counts[1::2])
            self.sums, self.counts = m * c, c
            self.rank_width *= 2
        bins = -(-n_ranks // self.rank_width)
        if bins > len(self.sums):
            rows = min(MAX_RANK_BINS, _pow2_at_least(bins))
            self.sums, self.counts = _grown(self.sums, rows), _grown(self.counts, rows)

    def fit_step(self, step: int) -> None:
        """Widen step bins (adding neighbours) until ``step`` has a column; grow columns."""
        while step // self.step_width >= MAX_STEP_BINS:
            cols = self.sums.shape[1] + self.sums.shape[1] % 2   # pairs of columns merge
            s, c = _grown(self.sums, cols=cols), _grown(self.counts, cols=cols)
            self.sums, self.counts = s[:, 0::2] + s[:, 1::2], c[:, 0::2] + c[:, 1::2]
            self.step_width *= 2
        need = step // self.step_width + 1
        if need > self.sums.shape[1]:
            # Doubling (from 64 columns): a run's grid is copied O(log) times as it grows, not
            # every 256 steps (each copy, when every grid held 256 rows, a third of the fold's
            # cost for 64-record pushes, and most of its page faults). Never past MAX_STEP_BINS.
            grow = max(need, min(MAX_STEP_BINS, max(64, 2 * self.sums.shape[1])))
            self.sums, self.counts = _grown(self.sums, cols=grow), _grown(self.counts, cols=grow)

    def add(self, steps: np.ndarray, bin_max: np.ndarray) -> None:
        """``bin_max``: (n_steps, bins) ratio per rank bin, NaN where no rank reported; the
        grid's first ``bins`` rows (:meth:`fit_ranks` made room for them; the rows after them
        get nothing)."""
        self.fit_step(int(steps.max()))
        cols = steps // self.step_width
        ok = np.isfinite(bin_max)
        if ok.all():   # the usual block: every bin has a rank (no mask to apply)
            vals = bin_max.astype(np.float32, copy=False)
        else:
            vals = np.where(ok, bin_max, 0.0).astype(np.float32)
        if len(cols) > 1 and (np.diff(cols) < 0).any():   # the aligner emits steps in order
            order = np.argsort(cols, kind="stable")
            cols, vals, ok = cols[order], vals[order], ok[order]
        # One sum per column the block touches, all in one call (a block of one-rank steps
        # touches many columns: a Python loop over them cost more than the rest of the fold).
        starts = np.flatnonzero(np.r_[True, cols[1:] != cols[:-1]])
        counts = ok.astype(np.float32)
        if len(starts) < len(cols):   # steps sharing a column: their sums first
            vals, counts = np.add.reduceat(vals, starts, axis=0), np.add.reduceat(counts, starts, axis=0)
        touched = cols[starts]        # increasing
        # Consecutive columns (the usual block): added through a slice, not gathered and
        # scattered by index (a block of 32 one-rank steps: most of the heat's cost).
        where = slice(int(touched[0]), int(touched[-1]) + 1) if touched[-1] - touched[0] == len(touched) - 1 else touched
        rows = slice(0, vals.shape[1])
        self.sums[rows, where] += vals.T
        self.counts[rows, where] += counts.T

    def truncate(self, step: int) -> None:
        """Forget steps >= ``step`` (a new attempt resumes there); the bin holding it is cleared
        whole, which costs at most ``step_width`` steps of heat."""
        col = step // self.step_width
        self.sums[:, col:] = 0
        self.counts[:, col:] = 0


class RunRollup:
    def __init__(self) -> None:
        self.n_steps = 0                               # steps 0..n_steps-1 have slots
        self.lines = {f: self._empty(0) for f in LINE_FIELDS}
        self.heat: dict[str, HeatGrid] = {}
        self.max_rank = -1
        self.steps_seen = 0                            # complete steps folded in (for stats)
        self.last_step = -1                            # highest step folded in

    def __repr__(self) -> str:
        return f"RunRollup(n_steps={self.n_steps}, heat={list(self.heat)}, max_rank={self.max_rank})"

    @staticmethod
    def _empty(n: int) -> dict[str, np.ndarray]:
        return {"median": np.full(n, np.nan, np.float32), "min": np.full(n, np.nan, np.float32),
                "max": np.full(n, np.nan, np.float32), "nonfinite": np.zeros(n, np.int32),
                "reported": np.zeros(n, np.int32)}

    def _ensure_steps(self, last_step: int) -> None:
        if last_step < self.n_steps:
            return
        # By half again (at least _GROW steps): amortised, a long run's lines are not copied
        # whole every 1,024 steps.
        n = max(last_step + 1, self.n_steps + max(_GROW, self.n_steps // 2))
        for f, stats in self.lines.items():
            grown = self._empty(n)
            for k, arr in stats.items():
                grown[k][:len(arr)] = arr
            self.lines[f] = grown
        self.n_steps = n

    def add_block(self, block: StepBlock) -> None:
        if block.n_steps == 0 or block.n_ranks == 0:
            return
        steps = block.steps
        self._ensure_steps(int(steps.max()))
        self.max_rank = max(self.max_rank, int(block.ranks.max()))
        self.steps_seen += block.n_steps
        self.last_step = max(self.last_step, int(steps.max()))
        # A field both drawn and heated (step_time) is partitioned once; the rows' minima of a
        # field whose every value is reported and finite say the heat whether all are positive.
        medians: dict[str, np.ndarray | None] = {}
        minima: dict[str, np.ndarray] = {}
        for f in LINE_FIELDS:
            if f in block.values:
                medians[f] = self._add_line(f, steps, block.values[f], block.present[f], minima)
        for f in HEAT_FIELDS:
            if f in block.values and block.present[f].any():
                self._add_heat(f, steps, block.ranks, block.values[f], block.present[f], medians.get(f), minima.get(f))

    def _add_line(self, f: str, steps: np.ndarray, v: np.ndarray, p: np.ndarray,
                  minima: dict[str, np.ndarray] | None = None) -> np.ndarray | None:
        """Fold the block's cross-rank statistics of ``f``; the medians when every value counted
        (and then the rows' minima into ``minima[f]``)."""
        st = self.lines[f]
        if p.all():
            # The usual block: every value reported. The rows' minima and maxima are drawn
            # anyway, and they say whether every value is finite (a NaN makes its row's minimum
            # NaN, an infinity is its row's minimum or maximum): then no mask is built and
            # nothing is counted (no value is non-finite, every rank reported).
            lo, hi = v.min(axis=1), v.max(axis=1)
            if np.isfinite(lo).all() and np.isfinite(hi).all():
                # A field every rank reports the same (a gradient norm taken after the
                # all-reduce, a loss averaged across ranks): each row's median is its minimum.
                med = lo if (lo == hi).all() else _median_of_rows(v)
                st["median"][steps] = med
                st["min"][steps], st["max"][steps] = lo, hi
                st["nonfinite"][steps] = 0
                st["reported"][steps] = v.shape[1]
                if minima is not None:
                    minima[f] = lo
                return med
        finite = p & np.isfinite(v)
        has = finite.any(axis=1)
        if has.any():
            xs = np.where(finite, v, np.nan)[has]
            st["median"][steps[has]] = row_median(v[has], finite[has])
            st["min"][steps[has]] = np.nanmin(xs, axis=1)
            st["max"][steps[has]] = np.nanmax(xs, axis=1)
        st["nonfinite"][steps] = (p & ~np.isfinite(v)).sum(axis=1)
        st["reported"][steps] = p.sum(axis=1)
        return None

    def _add_heat(self, f: str, steps: np.ndarray, ranks: np.ndarray, v: np.ndarray, p: np.ndarray,
                  all_values_median: np.ndarray | None = None, row_minima: np.ndarray | None = None) -> None:
        """``all_values_median``: the rows' medians over every value, when the line already took
        them (every value reported and finite), ``row_minima`` the rows' minima then; equal to
        this field's medians when every value is also positive."""
        grid = self.heat.get(f)
        if grid is None:
            grid = self.heat[f] = HeatGrid(rank_width=_pow2_at_least(-(-(self.max_rank + 1) // MAX_RANK_BINS)))
        grid.fit_ranks(self.max_rank + 1)
        if all_values_median is not None and row_minima is not None:
            clean = bool((row_minima > 0).all())
            med = all_values_median
        else:
            # Not a line field (compute_time), or a line with missing or non-finite values: every
            # value reported, finite and positive (NaN fails both comparisons) takes no mask.
            clean = bool(p.all()) and bool((v.min(axis=1) > 0).all()) and bool((v.max(axis=1) < np.inf).all())
            med = None
        # Only the bins up to the block's highest rank: the others would only add zeros (a run
        # of 64 ranks fills 64 of the 256 bins; the bins no rank filled count nothing either way).
        bins = min(MAX_RANK_BINS, -(-(int(ranks.max()) + 1) // grid.rank_width))
        width = grid.rank_width * bins
        n = len(ranks)
        dense = bool(n) and ranks[0] == 0 and ranks[-1] == n - 1
        if clean:
            # Every ratio is a value over its row's median: divided straight into the float32
            # row (numpy divides in float64 and rounds once, as the cast of the masked ratios
            # below does). The same numbers as the general way, without its masks.
            if med is None:
                med = _median_of_rows(v)
            if dense and n == width:
                full = np.empty((len(steps), width), np.float32)
                np.divide(v, med[:, None], out=full, casting="unsafe")
            else:
                full = np.full((len(steps), width), _NO_RANK, np.float32)
                if dense:
                    np.divide(v, med[:, None], out=full[:, :n], casting="unsafe")
                else:
                    full[:, ranks] = v / med[:, None]
        else:
            with np.errstate(invalid="ignore"):
                finite = p & np.isfinite(v) & (v > 0)
            # np.nanmedian loops over the rows in Python; a step where no rank reported has NaN.
            if not finite.all():
                med = row_median(v, finite)
            elif med is None:
                med = _median_of_rows(v)
            with np.errstate(all="ignore"):
                ratio = np.where(finite, v / med[:, None], _NO_RANK)
            # Scatter ranks (ids, maybe sparse) into full-width rows, then max over each bin. A
            # ratio is positive (or NaN: a step with no median), so the bins no rank filled keep
            # the negative marker through the max and become NaN after it (np.nanmax costs ~3x
            # as much).
            if dense:
                # A block's ranks are increasing: these are ranks 0..n-1 (the usual block), a
                # slice of the row, not a scatter by index (numpy's fancy assignment along the
                # rows' axis was most of the heat's cost, a slice a small part of it: timed in
                # process).
                if n == width:
                    full = ratio.astype(np.float32)
                else:
                    full = np.full((len(steps), width), _NO_RANK, np.float32)
                    full[:, :n] = ratio
            else:
                full = np.full((len(steps), width), _NO_RANK, np.float32)
                full[:, ranks] = ratio
        bin_max = _max_of_bins(full.reshape(len(steps), bins, grid.rank_width))
        if not (clean and dense and n == width):   # else every bin holds a rank's ratio
            bin_max[bin_max == _NO_RANK] = np.nan
        grid.add(steps, bin_max)

    def truncate(self, step: int) -> None:
        """A new attempt resumes at ``step``: forget the abandoned branch from there on."""
        for stats in self.lines.values():
            for k, arr in stats.items():
                arr[step:] = np.nan if arr.dtype.kind == "f" else 0
        for grid in self.heat.values():
            grid.truncate(step)
        self.last_step = min(self.last_step, step - 1)

    # -- snapshot -------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        arrays: dict[str, np.ndarray] = {"meta": np.array([self.n_steps, self.max_rank, self.steps_seen, self.last_step], np.int64)}
        for f, stats in self.lines.items():
            for k, arr in stats.items():
                arrays.update(_packed(f"line:{f}:{k}", arr))
        for f, grid in self.heat.items():
            arrays[f"heat:{f}:widths"] = np.array([grid.rank_width, grid.step_width], np.int64)
            arrays.update(_packed(f"heat:{f}:sums", grid.sums))
            arrays.update(_packed(f"heat:{f}:counts", grid.counts))
        buf = io.BytesIO()
        np.savez(buf, allow_pickle=True, **arrays)   # numpy's default, named so no key can be it
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "RunRollup":
        r = cls()
        with np.load(io.BytesIO(blob)) as npz:
            z = _unpacked(npz)
            r.n_steps, r.max_rank, r.steps_seen, r.last_step = (int(x) for x in z["meta"])
            r.lines = {f: cls._empty(r.n_steps) for f in LINE_FIELDS}
            for name in z:
                kind, f, k = (name.split(":") + ["", ""])[:3]
                if kind == "line" and f in r.lines:
                    r.lines[f][k] = z[name]
                elif kind == "heat" and k == "widths":
                    rw, sw = (int(x) for x in z[name])
                    r.heat[f] = HeatGrid(rw, sw, z[f"heat:{f}:sums"], z[f"heat:{f}:counts"])
        return r


# A snapshot's arrays are compressed one by one by blosc2 (a byte shuffle, then zstd at level 1)
# inside an uncompressed npz. The deflate of numpy's savez_compressed took 186 ms of CPU for a
# grown run (a 1,024-rank run of 4,000 steps: four 256 x 2,048 heat grids, 8 MB), every
# snapshot_every_s (30 s) for every active run: 0.6 % of a core a run; this takes 19 ms and
# writes 0.82x the bytes (bench/rollup_fold.py's snapshot table). Snapshots written before
# (deflated, the arrays as they are) still load: their keys carry no "@".
_PACKED_AS = "@"


def _packed(name: str, arr: np.ndarray) -> dict[str, np.ndarray]:
    """``{name@<dtype>: the compressed bytes, name@shape: the shape}``."""
    a = np.ascontiguousarray(arr)
    data = blosc2.compress(a, typesize=a.dtype.itemsize, clevel=1, codec=blosc2.Codec.ZSTD,
                           filter=blosc2.Filter.SHUFFLE)
    return {f"{name}{_PACKED_AS}{a.dtype.str}": np.frombuffer(data, np.uint8),
            f"{name}{_PACKED_AS}shape": np.array(a.shape, np.int64)}


def _unpacked(npz) -> dict[str, np.ndarray]:
    """Every array of a snapshot by its name, decompressed (writable: the rollup adds into them)."""
    out: dict[str, np.ndarray] = {}
    for key in npz.files:
        name, packed, kind = key.partition(_PACKED_AS)
        if not packed:
            out[name] = npz[key]
        elif kind != "shape":
            shape = tuple(int(n) for n in npz[f"{name}{_PACKED_AS}shape"])
            raw = blosc2.decompress(npz[key].tobytes(), as_bytearray=True)
            out[name] = np.frombuffer(raw, np.dtype(kind)).reshape(shape)
    return out
