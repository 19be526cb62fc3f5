"""Straggler: one rank persistently slower than its peers.

Synchronous training hides the straggler in ``step_time`` (every rank waits at the collective, so
all ranks report nearly the same step time). The detector therefore reads, per value, the first
source that can tell ranks apart:

1. ``compute_time`` — the slow rank computes longest;
2. ``step_time - comm_time`` — the compute part recovered from the wait asymmetry (the slow rank
   waits least in the collective, so its ``comm_time`` is the smallest);
3. ``step_time`` — only at steps where ranks are *not* synchronous, i.e. where the cross-rank
   spread ``(max - min) / median`` of ``step_time`` exceeds ``sync_spread``.

Maths, per step ``t`` and rank ``r`` (vectorised over ranks, sequential over steps):

- ``ratio[t, r] = value[t, r] / peer_median[t]`` where the peer median and the robust spread
  ``scale[t] = IQR / 1.349 / peer_median`` (floored at ``scale_floor``) come from a fixed,
  id-ordered subset of at most ``max_reference_ranks`` ranks (a median of 512 peers is within
  ~6 % of a noise sigma of the full median and costs a 512-element sort);
- an upper CUSUM in noise units ``S = max(0, S + min((ratio - 1) / scale, z_clip) - cusum_k)``
  gives persistence: a one-step hiccup adds at most ``z_clip - cusum_k``;
- the magnitude of a CUSUM run: an EWMA ``U`` of ``ratio`` (``level_alpha``) restarted from 0
  whenever the CUSUM is zero, bias-corrected after ``n`` observations in the run:
  ``ratio_hat = U / (1 - (1 - level_alpha) ** n)`` — close to the plain mean since onset for a
  fresh straggler, and a slow EWMA for long runs, so a rank persistently just under
  ``min_ratio`` does not drift over it by noise. (No masked updates: the restart is a multiply
  by ``S > 0``, which keeps the per-step cost at a few passes over the ranks.)

A rank fires when ``S >= cusum_h`` and ``ratio_hat >= min_ratio``; the onset is the first step
of that CUSUM run. A stricter CUSUM (allowance ``onset_k``) runs beside the sensitive one: when
its run is at least 3 steps long it dates the onset and measures the reported ratio (with fewer than 8
steps, the sensitive run measures it when its earlier steps agree: a short strict run that began on
a noisy high is biased up; see ``StragglerReplay._measure``), because the
sensitive CUSUM (small ``cusum_k``, to name a 1.3x straggler within tens of steps against 20-30 %
jitter) often starts its run on noise a few steps before the fault. **It must last to page**: when the records carry ``ts`` (the trainer's clock),
that first finding is ``info`` (the rank is named at once, no page) and a ``warning`` (or
``critical``) follows once the rank is still slow (fast EWMA of its ratio at least ``min_ratio``)
``min_duration_s`` of trainer time later, so scheduling noise on a shared machine never pages and a
replay or backlog that arrives compressed is judged by when the steps ran. Without ``ts`` the first
finding carries the severity (``step - n + 1``: exact unless values were missing inside the run). While it
fires, a fast EWMA of ``ratio`` (``resolve_alpha``) follows recovery: it resolves once that EWMA
stays under ``resolve_ratio`` for ``resolve_steps`` consecutive observations. Severity is
``critical`` from ``critical_ratio`` on, else ``warning`` (decided when it fires; it does not
escalate later); ``score = (ratio_hat - min_ratio) / (critical_ratio - min_ratio)`` clipped to
[0, 1]. The host is not known here (blocks are numeric); the service adds it from the rank.

Example (a seeded trace where rank 5 computes 1.3x slower from step 300)::

    >>> from simulation import simulate_run, Straggler
    >>> run = simulate_run(n_steps=600, n_ranks=16, seed=1, faults=[Straggler(step=300, rank=5)])
    >>> [(f.step, f.ranks, f.onset_step, f.evidence["ratio"]) for f in StragglerDetector().update(run.block)]
    [(303, (5,), 300, 1.3006)]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from healthsvc_detectors.base import BlockDetector, Detector
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.frame import StepBlock, fill_trainer_time, trainer_time
from healthsvc_detectors.straggler.reference import StragglerReference
from healthsvc_detectors.straggler.replay import StragglerReplay, _Column

# The per-rank CUSUMs, run levels and counts are float32: at 16,384 ranks the recursions are
# bound by memory traffic and SIMD width, and float32 halves both. Seven digits are far more than
# a CUSUM in noise units (threshold 20) or a ratio reported to four decimals needs, and counts
# are exact to 16 million steps. The replay of a rank does the same float32 arithmetic, so block
# boundaries still do not change a result.
_RECURSION_DTYPE = np.float32


class StragglerDetector(StragglerReference, StragglerReplay, Detector, BlockDetector):
    """One rank persistently slower than its peers (kind ``straggler``); blames that rank."""

    kind = "straggler"
    kinds = (Kind("straggler", "One rank is persistently slower than its peers and holds every step back.",
                  resolves="condition", mutes=frozenset(), corruption=None, heals=True,
                  onset_guessed=False, probe=False, incident=None, restarts_at=None, blames_host=True, label="straggler",
                  colour="#8c564b"),)

    def __init__(
        self,
        min_ratio: float = 1.05,
        critical_ratio: float = 1.5,
        cusum_k: float = 0.75,
        cusum_h: float = 20.0,
        z_clip: float = 6.0,
        level_alpha: float = 0.02,
        resolve_alpha: float = 0.1,
        resolve_ratio: float = 1.025,
        resolve_steps: int = 10,
        warmup_steps: int = 10,
        sync_spread: float = 0.02,
        scale_floor: float = 0.005,
        min_ranks: int = 4,
        max_reference_ranks: int = 512,
        min_duration_s: float = 30.0,
        onset_k: float = 1.5,
    ) -> None:
        if not 1.0 < resolve_ratio < min_ratio < critical_ratio:
            raise ValueError("need 1 < resolve_ratio < min_ratio < critical_ratio, got "
                             f"{resolve_ratio}, {min_ratio}, {critical_ratio}")
        if min_ranks < 3:
            raise ValueError(f"min_ranks must be >= 3 (a median needs peers), got {min_ranks}")
        self.min_ratio = min_ratio
        self.critical_ratio = critical_ratio
        self.cusum_k = cusum_k
        self.cusum_h = cusum_h
        self.z_clip = z_clip
        self.level_alpha = level_alpha
        self.resolve_alpha = resolve_alpha
        self.resolve_ratio = resolve_ratio
        self.resolve_steps = resolve_steps
        self.warmup_steps = warmup_steps
        self.sync_spread = sync_spread
        self.scale_floor = scale_floor
        self.min_ranks = min_ranks
        self.max_reference_ranks = max_reference_ranks
        self.min_duration_s = min_duration_s
        self.onset_k = max(onset_k, cusum_k)
        self.min_onset_steps = 3    # steps of the stricter run needed to date the onset
        self.min_measure_steps = 8  # ... and to measure the ratio on its own (see _measure)
        super().__init__()

    # ------------------------------------------------------------------------------ state
    def _reset(self) -> None:
        self._ids = np.zeros(0, dtype=np.int64)        # known rank ids, sorted
        # The per-rank recursions run in float32 (see _RECURSION_DTYPE).
        f32 = _RECURSION_DTYPE
        self._cusum = np.zeros(0, f32)                 # S, noise units
        self._mcusum = np.zeros(0, f32)                # the same with allowance onset_k
        self._mlevel = np.zeros(0, f32)                # U and n of the run of that CUSUM: they
        self._mcount = np.zeros(0, f32)                # date the onset and measure the ratio
        self._run_level = np.zeros(0, f32)             # U: EWMA of ratio since the run started
        self._run_count = np.zeros(0, f32)             # n: observations since the run started
        self._recent = np.ones(0)                      # fast EWMA of ratio, firing ranks only
        self._n_obs = np.zeros(0, dtype=np.int64)      # valid observations seen (warm-up)
        self._firing = np.zeros(0, dtype=bool)
        self._source = np.zeros(0, dtype=np.int8)      # index into SOURCES of the open finding
        self._below = np.zeros(0, dtype=np.int64)      # consecutive observations under resolve
        self._fire_ts = np.zeros(0)                    # trainer time when it fired (-1: unknown)
        self._paged = np.zeros(0, dtype=bool)          # the open episode reached warning
        self._onset = np.zeros(0, dtype=np.int64)      # onset step of the open episode (-1: none)
        self._warm = True                              # every known rank is past warm-up
        self._last_ts: float | None = None             # the latest trainer time seen
        self._ref_cols: np.ndarray | None = None       # cached reference subset positions
        self._last_ids: np.ndarray | None = None       # the ids array of the last full block

    _ARRAYS = ("_ids", "_cusum", "_mcusum", "_mlevel", "_mcount", "_run_level", "_run_count", "_recent", "_n_obs", "_firing",
               "_source", "_below", "_fire_ts", "_paged", "_onset")

    def state_dict(self) -> dict[str, Any]:
        return {**{name[1:]: getattr(self, name).tolist() for name in self._ARRAYS},
                "last_ts": self._last_ts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        for name in self._ARRAYS:
            if name[1:] in state:
                setattr(self, name, np.asarray(state[name[1:]], dtype=getattr(self, name).dtype))
        self._last_ts = state.get("last_ts")
        n = len(self._ids)
        if len(self._fire_ts) != n:       # a state saved before these fields existed
            self._fire_ts, self._paged = np.full(n, -1.0), self._firing.copy()
        if len(self._onset) != n:
            self._onset = np.full(n, -1, dtype=np.int64)
        if len(self._mcusum) != n:
            self._mcusum, self._mlevel = self._cusum.copy(), self._run_level.copy()
            self._mcount = self._run_count.copy()
        self._warm = bool((self._n_obs >= self.warmup_steps).all())

    def _grow(self, ids: np.ndarray) -> None:
        """Add rank ids never seen before (rare: start-up and elastic growth)."""
        merged = np.union1d(self._ids, ids)
        old = np.searchsorted(merged, self._ids)
        defaults = {"_cusum": 0.0, "_mcusum": 0.0, "_mlevel": 0.0, "_mcount": 0.0, "_run_level": 0.0, "_run_count": 0.0, "_recent": 1.0,
                    "_n_obs": 0, "_firing": False, "_source": 0, "_below": 0,
                    "_fire_ts": -1.0, "_paged": False, "_onset": -1}
        for name, fill in defaults.items():
            cur = getattr(self, name)
            arr = np.full(len(merged), fill, dtype=cur.dtype)
            arr[old] = cur
            setattr(self, name, arr)
        self._ids = merged
        self._last_ids = None
        self._warm = bool((self._n_obs >= self.warmup_steps).all())

    # ------------------------------------------------------------------------------ update
    def update(self, block: StepBlock) -> list[Finding]:
        if block.n_steps == 0 or block.n_ranks == 0:
            return []
        ids = block.ranks
        same = ids is self._last_ids or (
            len(ids) == len(self._ids) and bool((ids == self._ids).all()))
        if not same:
            if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():
                block = block.take_ranks(np.argsort(ids, kind="stable"))
                ids = block.ranks
                same = len(ids) == len(self._ids) and bool((ids == self._ids).all())
        if "compute_time" not in block.values and "step_time" not in block.values:
            return []
        if not same:
            if not np.isin(ids, self._ids, assume_unique=True).all():
                self._grow(ids)
            same = len(ids) == len(self._ids)
        pos = None if same else np.searchsorted(self._ids, ids)
        self._last_ids = ids if same else None

        ts, self._last_ts = fill_trainer_time(trainer_time(block), self._last_ts)
        v, ok, src = self._timings(block)
        med, scale, usable = self._reference(v, ok)
        if usable is not None:
            ok = (np.ones(v.shape, dtype=bool) if ok is None else ok) & usable[:, None]
        seen = None
        if not self._warm:
            n_obs = self._n_obs if pos is None else self._n_obs[pos]
            ok = np.ones(v.shape, dtype=bool) if ok is None else ok
            seen = ok.sum(axis=0)   # valid observations, warm-up included
            ok = ok & (n_obs + np.cumsum(ok, axis=0) > self.warmup_steps)
        if ok is not None and ok.all():
            ok = None

        # Per step, z - k = ratio / scale - 1 / scale - k = value * a_y + b_y (clipped), and the
        # run level gains alpha * ratio = value * a_g. Those come for the whole block at once;
        # the recursions then advance one row at a time over rank vectors, in place, each step
        # the same IEEE operations, so any split of the input gives the same state. Missing
        # values add nothing and leave the run level alone.
        inv_med = 1.0 / med
        alpha = self.level_alpha
        f32 = _RECURSION_DTYPE
        a_y, b_y, a_g = ((inv_med / scale).astype(f32), (-1.0 / scale - self.cusum_k).astype(f32),
                         (alpha * inv_med).astype(f32))
        cap = self.z_clip - self.cusum_k
        okf = None
        if ok is not None:
            v = np.where(ok, v, 0.0)
            okf = ok.astype(f32)
        v64, v = v, v.astype(f32)      # the recursions' copy; ratios and evidence in float64

        n, r = v.shape
        sel = slice(None) if pos is None else pos
        if pos is None:
            cusum, level, run_count = self._cusum, self._run_level, self._run_count  # in place
            mcusum, mlevel, mcount = self._mcusum, self._mlevel, self._mcount
        else:
            cusum, level, run_count = self._cusum[pos], self._run_level[pos], self._run_count[pos]
            mcusum, mlevel, mcount = self._mcusum[pos], self._mlevel[pos], self._mcount[pos]
        firing = self._firing[sel]
        # Ranks that may reach h in this block (S rises by at most z_clip - k per step) are
        # replayed one by one afterwards from their start values; with long blocks that bound is
        # loose, so then every rank's peak S is tracked instead.
        track_peak = 2 * n * cap > self.cusum_h
        if not track_peak:
            maybe = np.flatnonzero((cusum >= self.cusum_h - n * cap) | firing)
            track_peak = len(maybe) > max(16, r // 256)
        if track_peak:
            start = (cusum.copy(), level.copy(), run_count.copy(), mcusum.copy(), mlevel.copy(),
                     mcount.copy())
            peak = cusum.copy()
        else:
            start = (cusum[maybe], level[maybe], run_count[maybe], mcusum[maybe], mlevel[maybe],
                     mcount[maybe])
        running = np.empty(r, f32)     # 1.0 while the run goes on, 0.0 at a zero
        mrunning = np.empty(r, f32)
        zeros = np.zeros(r, f32)       # numpy's maximum against an array is SIMD, not a scalar
        if okf is None:
            rows = self._dense_rows(v, a_y, b_y, a_g, cap)
        else:
            rows = self._masked_rows(v, okf, a_y, b_y, a_g, cap)
        for y, ym, gain, decay, counted in rows:
            cusum += y
            np.maximum(cusum, zeros, out=cusum)
            if track_peak:
                np.maximum(peak, cusum, out=peak)
            # A stricter CUSUM (allowance onset_k) runs beside: its run dates the onset and
            # measures the reported ratio, since the sensitive one may start early on noise.
            mcusum += ym
            np.maximum(mcusum, zeros, out=mcusum)
            np.greater(mcusum, 0.0, out=mrunning)
            mlevel *= decay
            mlevel += gain
            mlevel *= mrunning
            mcount += counted
            mcount *= mrunning
            np.greater(cusum, 0.0, out=running)    # a zero restarts the run
            level *= decay
            level += gain
            level *= running
            run_count += counted
            run_count *= running

        # Ranks with something to decide are replayed one by one (few: firing or past h).
        if track_peak:
            busy = np.flatnonzero((peak >= self.cusum_h) | firing)
            starts = [(j, *(a[j] for a in start)) for j in busy]
        else:
            starts = list(zip(maybe, *start))
        findings: list[Finding] = []
        for j, s0, l0, c0, m0, ml0, mc0 in starts:
            k = j if pos is None else int(pos[j])
            col = _Column(cusum=s0, mcusum=m0, mlevel=ml0, mcount=mc0, level=l0, count=c0,
                          firing=bool(self._firing[k]),
                          below=int(self._below[k]), source=int(self._source[k]),
                          recent=float(self._recent[k]), fire_ts=float(self._fire_ts[k]),
                          paged=bool(self._paged[k]))
            col.onset = int(self._onset[k]) if self._onset[k] >= 0 else None
            # The same elementwise arithmetic as the loop above, for one column.
            y_col = np.minimum(v[:, j] * a_y + b_y, cap)
            if okf is not None:
                y_col *= okf[:, j]
            ok_col = np.ones(n, dtype=bool) if ok is None else ok[:, j]
            findings += self._replay(col, int(ids[j]), block.steps, y_col, v[:, j] * a_g,
                                     ok_col, v64[:, j], med, scale, src, ts)
            cusum[j], level[j], run_count[j] = col.cusum, col.level, col.count
            mcusum[j], mlevel[j], mcount[j] = col.mcusum, col.mlevel, col.mcount
            self._firing[k], self._below[k] = col.firing, col.below
            self._source[k], self._recent[k] = col.source, col.recent
            self._fire_ts[k], self._paged[k] = col.fire_ts, col.paged
            self._onset[k] = -1 if col.onset is None else col.onset

        if pos is not None:
            self._cusum[pos], self._run_level[pos], self._run_count[pos] = cusum, level, run_count
            self._mcusum[pos], self._mlevel[pos], self._mcount[pos] = mcusum, mlevel, mcount
        if seen is not None:
            self._n_obs[sel] += seen
            self._warm = bool((self._n_obs >= self.warmup_steps).all())
        findings.sort(key=lambda f: (f.step, f.ranks))
        return findings

    _BLOCK_AT_ONCE = 1 << 16   # cells: larger blocks are computed row by row, in cache

    def _dense_rows(self, v: np.ndarray, a_y: np.ndarray, b_y: np.ndarray, a_g: np.ndarray,
                    cap: float):
        """Per row, with every value present: the CUSUM increments ``y``, ``y`` less the strict
        allowance, the run-level gain, the level's decay and the count's increment.

        Small blocks compute them for the whole block at once (fewer numpy calls, which is what
        costs at a thousand ranks); large ones row by row into three reused vectors, which stay
        in the cache while (steps x ranks) arrays would not. The same numbers either way.
        """
        n, r = v.shape
        alpha, dk = self.level_alpha, self.onset_k - self.cusum_k
        caps = np.full(r, cap, v.dtype)   # minimum against an array is SIMD, a scalar not
        if v.size <= self._BLOCK_AT_ONCE:
            y_all = v * a_y[:, None]
            y_all += b_y[:, None]
            np.minimum(y_all, caps, out=y_all)
            ym_all = y_all - dk
            gain_all = v * a_g[:, None]
            for i in range(n):
                yield y_all[i], ym_all[i], gain_all[i], 1.0 - alpha, 1.0
            return
        y, ym, gain = (np.empty(r, v.dtype) for _ in range(3))
        for i in range(n):
            np.multiply(v[i], a_y[i], out=y)
            y += b_y[i]
            np.minimum(y, caps, out=y)
            np.subtract(y, dk, out=ym)
            np.multiply(v[i], a_g[i], out=gain)
            yield y, ym, gain, 1.0 - alpha, 1.0

    def _masked_rows(self, v: np.ndarray, okf: np.ndarray, a_y: np.ndarray, b_y: np.ndarray,
                     a_g: np.ndarray, cap: float):
        """Per row, with missing values (``okf`` 0): the CUSUM increments ``y`` (and ``y`` less
        the strict allowance), the run-level gain, the level's decay and the count's increment;
        a missing value adds nothing and leaves the run level alone."""
        alpha, dk = self.level_alpha, self.onset_k - self.cusum_k
        for i in range(len(v)):
            y = np.minimum(v[i] * a_y[i] + b_y[i], cap)
            y *= okf[i]
            yield y, y - dk * okf[i], v[i] * a_g[i], 1.0 - alpha * okf[i], okf[i]
