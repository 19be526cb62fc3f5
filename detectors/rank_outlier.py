"""``rank_outlier``: a rank whose values disagree persistently with its peers.

The cheap silent-corruption tell that needs no re-run. Data-parallel ranks see different
micro-batches of the same distribution, so over many steps every rank's loss and local gradient
norm should sit, on average, where its peers' do; and the global gradient norm after the
all-reduce should be the very same number on every rank.

**Distribution metrics** (``metrics``, default ``local_grad_norm`` and ``loss``): each step, each
rank's value in log space is compared with the median of its peers (the other reference ranks,
at most ``max_reference_ranks`` chosen by id, but the current suspects, so one corrupted rank
cannot make its healthy peers look low) and judged by the rank's own history of deviating from
them (:class:`~healthsvc_detectors.peers.PeerDeviation`: its usual offset and spread, learned over
``warmup_steps`` values and then slowly): a z in the rank's own sds, so normal offsets are not
outliers and any world size from 2 up needs no tuning. It is clipped to ``±z_clip`` so one wild
step counts as a few sds, not a thousand. With two ranks the deviations mirror each other and
no majority tells which one moved: both ranks are named in one finding whose evidence says so
(``pair``, ``note``, ``direction`` "apart"). A per-rank exponentially weighted mean of that z
(gain ``1 / window_steps``) is the evidence: under the null it stays within about
``sqrt(1 / (2 window_steps))`` sds of zero (0.07 for 100 steps); a rank whose mean passes
``z_warning`` in either direction fires ``warning``, past ``z_critical`` ``critical``; it resolves
below ``z_warning / 2``. A 3x local gradient norm (z ~ 10) fires within ~10 steps; a loss biased by
5 % with a 4 % micro-batch spread (z ~ 1.2) within ~70. A rank whose z has averaged past the
tracker's ``suspect_z`` is a suspect, and a suspect's usual offset stops following its values
(only its long-run mean is refined), so a lasting bias is not learned as the rank's normal and
its episode does not resolve while the rank is still off.

**A lasting offset after a jump** (distribution metrics): a replica whose weights were corrupted
at one step (a bit flip) shows it as a jump of its own loss, and then, since data-parallel
replicas never re-sync their weights, as an offset against its peers that stays, often far too
small (1 %) for the weighted mean above. So a rank whose value jumps above ``jump_z`` of its own
sds (6: a value its tracker refuses to learn) is watched: from its first step back below 3 sds,
the n steps' z (each clipped to +-3, so one later hard batch cannot make an offset) are summed,
and ``sum / sqrt(n)`` (about N(0, 1) for a rank back at its usual place) at ``offset_z`` (4) or
more, after at least ``offset_min_steps``, is a ``warning`` with ``onset_step`` at the jump
(``evidence.reason`` "lasting offset after a jump"), so the rollback answer goes before the jump.
A jump that leaves no offset within ``offset_watch_steps`` (a garbage batch, whose gradient went
to every replica alike) is forgotten. A 1 % offset against a per-rank spread of 4 % is found
~250 steps after the jump; the jump itself stays the spike detector's ``info``. It is looked for
in ``offset_metrics``, the loss by default: that is what a replica's own weights change directly,
while a rank's local gradient norm after a job-wide disturbance (a peer's garbage batch, whose
gradient every replica applied) settles back with a lag of its own, seen on real trainings as a
healthy rank's lasting offset.

**Global metrics** (``global_metrics``, default ``grad_norm``): a rank whose value differs from the
step's cross-rank median by more than ``rel_tol`` (relative) disagrees. The per-rank weighted
share of disagreeing steps fires ``warning`` once it equals ``patience_steps`` consecutive
disagreements (one isolated glitch is not enough), ``critical`` past ``global_critical_share``.

Every kind of episode turns ``critical`` once it has lasted ``escalate_steps`` observed steps.
``onset_step`` is the first step after the rank was last unremarkable (its statistic below half
the warning level). Missing cells leave a rank's state untouched; new ranks start from zero.

Score: distribution metrics ``(|mean z| - z_warning) / (z_critical - z_warning)``; global metrics
the weighted share of disagreeing steps; both clipped to [0, 1].

>>> from simulation import simulate_run, CorruptRank
>>> run = simulate_run(n_steps=1_000, n_ranks=32, seed=2, faults=[CorruptRank(step=600, rank=9)])
>>> [(f.metric, f.step, f.ranks, f.severity, f.onset_step) for f in RankOutlierDetector().update(run.block)]
[('local_grad_norm', 614, (9,), 'warning', 608), ('local_grad_norm', 643, (9,), 'critical', 608)]
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from healthsvc_detectors.base import BlockDetector, Detector
from healthsvc_detectors.finding import Finding, Severity
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.peers import PAIR_NOTE, PeerDeviation, PeerView
from healthsvc_detectors.stats.cross_section import ReferenceRanks, cross_section
from healthsvc_detectors.stats.machines import ewma_rows, hysteresis, last_step_where, run_length
from healthsvc_detectors.stats.rank_table import RankTable
from healthsvc_detectors.stats.scales import excess_score

_NEVER = -(2 ** 62)   # "no quiet step seen yet", "no jump watched"
_MIN_STEP = np.iinfo(np.int64).min
# After a jump, a rank is back from it once its z is below this, and each later step counts at
# most this many sds towards a lasting offset (one hard batch cannot make one).
_SETTLE_Z = 3.0


class RankOutlierDetector(Detector, BlockDetector):
    """One rank's values disagree with its peers' for many steps (see the module doc).

    Parameters
    ----------
    metrics: per-rank metrics compared with the peer distribution (log space).
    global_metrics: metrics that must be identical on all ranks.
    window_steps: memory of the per-rank weighted means, in judged steps (gain 1 / window_steps).
    z_warning, z_critical: weighted-mean z (cross-rank robust sds) for warning and critical.
    z_clip: per-step z is clipped to +-z_clip before averaging.
    min_scale: floor of a rank's own sd of deviating from its peers, log units (0.01 ~ 1 %):
        identical values are not
        outliers of each other because of rounding.
    rel_tol: relative difference from the median at which a global value disagrees.
    patience_steps: consecutive disagreements (equivalently weighted share) to fire for globals.
    global_critical_share: weighted share of disagreeing steps at which a global turns critical
        (0.5 = about half of the recent window; a constant disagreement gets there in ~70 steps).
    escalate_steps: observed steps an episode lasts before it turns critical.
    max_reference_ranks: ranks (chosen by id) used for the per-step median and sd.
    min_ranks: fewest reporting ranks for a step to be judged (2: any job with peers).
    warmup_steps: values of a rank learned (its usual offset and spread) before it is judged.
    stride_steps: judge only steps divisible by this (None: 1 up to 2,048 ranks, then
        ceil(ranks / 2048), so 16k ranks are judged every 8th step). The window and the
        patience count judged steps (so detection takes ``stride`` times longer), escalate_steps
        counts steps; firing steps are multiples of the stride.
    offset_metrics, jump_z, offset_z, offset_min_steps, offset_watch_steps: a lasting offset
        after a jump (see the module doc): the metrics it is looked for in (of ``metrics``), the
        z of the jump, the level of the offset statistic, the fewest steps after the jump it
        needs, and how long after a jump it is looked for.
    """

    kind = "rank_outlier"
    kinds = (Kind("rank_outlier", "One rank's values disagree with its peers': a silent data corruption suspect.",
                  resolves="latched", mutes=frozenset(), corruption="drift", heals=True,
                  onset_guessed=False, probe=True, incident="corruption", restarts_at="warning", blames_host=True, label="rank outlier",
                  colour="#9467bd"),)

    def __init__(self, metrics: tuple[str, ...] = ("local_grad_norm", "loss"),
                 global_metrics: tuple[str, ...] = ("grad_norm",), window_steps: int = 100,
                 z_warning: float = 0.6, z_critical: float = 2.0, z_clip: float = 6.0,
                 min_scale: float = 0.01, rel_tol: float = 1e-3, patience_steps: int = 3,
                 global_critical_share: float = 0.5, escalate_steps: int = 300,
                 max_reference_ranks: int = 256, min_ranks: int = 2, warmup_steps: int = 50,
                 stride_steps: int | None = None, offset_metrics: tuple[str, ...] = ("loss",),
                 jump_z: float = 6.0, offset_z: float = 4.0, offset_min_steps: int = 30,
                 offset_watch_steps: int = 500) -> None:
        if min_ranks < 2:
            raise ValueError(f"min_ranks must be >= 2 (a rank needs a peer), got {min_ranks}")
        self.metrics, self.global_metrics = tuple(metrics), tuple(global_metrics)
        self.window_steps = window_steps
        self.z_warning, self.z_critical, self.z_clip = z_warning, z_critical, z_clip
        self.min_scale, self.rel_tol, self.patience_steps = min_scale, rel_tol, patience_steps
        self.global_critical_share = global_critical_share
        self.escalate_steps = escalate_steps
        self.max_reference_ranks, self.min_ranks = max_reference_ranks, min_ranks
        self.stride_steps = stride_steps
        self.warmup_steps = warmup_steps
        self.offset_metrics = tuple(offset_metrics)
        self.jump_z, self.offset_z = jump_z, offset_z
        self.offset_min_steps, self.offset_watch_steps = offset_min_steps, offset_watch_steps
        self._alpha, self._escalate_rows = 1.0 / window_steps, escalate_steps
        super().__init__()

    def _reset(self) -> None:
        self._reference = ReferenceRanks(self.max_reference_ranks)
        fields = {"mean": np.float32(0.0), "active": False, "critical": False, "run": 0, "quiet": _NEVER,
                  # a jump being watched for a lasting offset: its step, whether the rank came back
                  # below _SETTLE_Z since, and the sum and count of its clipped z since then
                  "watch": _NEVER, "settled": False, "wsum": 0.0, "wn": 0}
        self._tables = {m: RankTable(fields) for m in (*self.metrics, *self.global_metrics)}
        self._buffers: dict[str, np.ndarray] = {}
        old = getattr(self, "_peers", {})
        self._peers = {}
        for m in self.metrics:
            if m in old and old[m].shared:
                old[m].reset()
                self._peers[m] = old[m]
            else:
                self._peers[m] = PeerDeviation(warmup_steps=self.warmup_steps, min_scale=self.min_scale)

    def peer_deviations(self) -> dict[str, PeerDeviation]:
        """The per-rank trackers by metric (the suite may share one with another detector)."""
        return dict(self._peers)

    def use_peer_deviation(self, metric: str, tracker: PeerDeviation) -> None:
        if metric in self._peers:
            self._peers[metric] = tracker

    def stride_for(self, n_ranks: int) -> int:
        """Judge every k-th step (by step number): ``stride_steps``, or by default 1 up to 2,048
        ranks and ceil(n_ranks / 2048) beyond, which keeps the cost per step flat at scale."""
        if self.stride_steps is not None:
            return max(1, int(self.stride_steps))
        return max(1, -(-n_ranks // 2048))

    # ------------------------------------------------------------------------------- update
    def update(self, block: StepBlock) -> list[Finding]:
        if block.n_steps == 0:
            return []
        stride = self.stride_for(block.n_ranks)
        ref = self._reference(block.ranks)
        # A tracker shared with a spike detector has seen (or will see) every step: read its view
        # of the whole block, then keep the judged rows. A private one learns the judged rows only.
        views = {m: self._peers[m].view(block, m, ref) for m in self.metrics
                 if m in block.values and self._peers[m].shared}
        rows: slice | np.ndarray = slice(None)
        if stride > 1:
            judged = np.flatnonzero(block.steps % stride == 0)
            if len(judged) == 0:
                return []
            rows = judged
            if block.steps[-1] - block.steps[0] == block.n_steps - 1:
                rows = slice(int(judged[0]), None, stride)   # consecutive steps: a view, no copy
            used = [m for m in (*self.metrics, *self.global_metrics) if m in block.values]
            block = StepBlock(steps=block.steps[rows], ranks=block.ranks,
                              values={m: block.values[m][rows] for m in used},
                              present={m: block.present[m][rows] for m in used})
        # The window counts judged steps (its noise level, hence the thresholds, must not change
        # with the stride); escalation counts steps.
        self._alpha = 1.0 / self.window_steps
        self._escalate_rows = max(1, -(-self.escalate_steps // stride))
        findings: list[Finding] = []
        present = [m for m in self.metrics if m in block.values]
        if present:
            findings += self._distributions(block, present, ref, views, rows)
        for m in self.global_metrics:
            if m in block.values:
                findings += self._global(block, m, ref)
        findings.sort(key=lambda f: (f.step, f.status != "firing", f.metric or "", f.severity, f.ranks))
        return findings

    def _distributions(self, block: StepBlock, metrics: list[str], ref: np.ndarray,
                       views: dict[str, PeerView], rows: slice | np.ndarray) -> list[Finding]:
        """The distribution metrics of a block side by side in one work array: the weighted
        means' loop over the rows costs per call, not per cell, so it runs once for all of them;
        each metric is then judged on its own columns (its findings in the order of
        ``metrics``)."""
        n, r = block.n_steps, block.n_ranks
        zs = self._buffer("z", (n, len(metrics) * r))
        m0 = self._buffer("m0", (len(metrics) * r,))
        parts = []
        for i, metric in enumerate(metrics):
            v = views.get(metric)
            if v is None:
                v = self._peers[metric].view(block, metric, ref)   # a private tracker: this block
                z, centre, count, top = v.z, v.centre, v.count, v.z_row_max
            else:
                z, centre, count, top = v.z[rows], v.centre[rows], v.count[rows], v.z_row_max[rows]
            jumps = self._jumps(block, metric, z, top, centre) if metric in self.offset_metrics else []
            # Each rank against its peers, in its own sds of deviating from them: normal offsets
            # are learned, and a 2-rank job is judged as well as a 16k-rank one. Clipped into the
            # work array in one pass (NaN stays NaN; the view is shared and read-only).
            cols = slice(i * r, (i + 1) * r)
            zc = np.clip(z, -self.z_clip, self.z_clip, out=zs[:, cols])
            if count.min() < self.min_ranks:
                zc[count < self.min_ranks] = np.nan
            table = self._tables[metric]
            at = table.index(block.ranks)
            m0[cols] = table["mean"][at]
            parts.append((metric, cols, centre, jumps, table, at))
        # One sum tells whether any cell is not judged (clipped values cannot overflow it), the
        # usual case being none. (A metric whose cells all are is then masked by an all-true
        # mask: the masked path rounds as the unmasked one, and judges the same.)
        judged_mask = None
        if not np.isfinite(zs.sum()):
            judged_mask = np.isfinite(zs)
            zs[~judged_mask] = 0.0
        means = ewma_rows(zs, judged_mask, self._alpha, m0, out=self._buffer("means", zs.shape))
        # (Into the work array of the z, spent by now: a smaller footprint in the cache.)
        sizes = np.abs(means, out=zs)
        peaks = np.fmax.reduce(sizes, axis=0)
        findings: list[Finding] = []
        for metric, cols, centre, jumps, table, at in parts:
            table["mean"][at] = means[-1, cols]
            size, peak = sizes[:, cols], peaks[cols]
            if r == 2:
                # Two ranks mirror each other (each one's centre is the other): a disagreement
                # is of the pair, and both are named together, never one of them on a guess.
                size = np.broadcast_to(size.max(axis=1, keepdims=True), size.shape).copy()
                peak = None
            findings += jumps + self._judge(block, metric, at, size, means[:, cols], None,
                                            None if judged_mask is None else judged_mask[:, cols],
                                            self.z_warning, self.z_critical, centre=centre,
                                            signed=True, peak=peak)
        return findings

    def _buffer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 work array reused from block to block (nothing in it outlives a block): a
        fresh one per block would cost page faults and allocations, not arithmetic."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape:
            buf = self._buffers[name] = np.empty(shape, dtype=np.float32)
        return buf

    def _jumps(self, block: StepBlock, metric: str, z: np.ndarray, top: np.ndarray,
               centre: np.ndarray) -> list[Finding]:
        """A lasting offset after a jump: a rank whose value jumped past ``jump_z`` of its own
        sds (a value its tracker will not learn) is watched for ``offset_watch_steps`` steps;
        once back below ``_SETTLE_Z`` sds, the sum of its z (each clipped to +-``_SETTLE_Z``)
        over the n steps since, divided by sqrt(n), past ``offset_z`` (and n at least
        ``offset_min_steps``) is a ``warning`` dated at the jump. ``z`` are the raw (unclipped)
        z of the block, ``top`` an upper bound of each row's largest."""
        table = self._tables[metric]
        at = table.index(block.ranks)
        watching = table["watch"][at] != _NEVER
        hot = np.flatnonzero(top > self.jump_z)
        if len(hot) == 0 and not watching.any():
            return []          # the usual case: nothing jumped, nobody is watched
        with np.errstate(invalid="ignore"):
            jumped = (z[hot] > self.jump_z).any(axis=0) if len(hot) else np.zeros(len(watching), dtype=bool)
        out: list[Finding] = []
        steps = block.steps.tolist()
        jump_z, watch_steps = self.jump_z, self.offset_watch_steps
        min_steps, offset_z = self.offset_min_steps, self.offset_z
        isfinite, sqrt = math.isfinite, math.sqrt
        for c in np.flatnonzero(jumped | watching).tolist():   # a few columns at most: a loop is fine
            p = c if isinstance(at, slice) else int(at[c])
            watch, settled = int(table["watch"][p]), bool(table["settled"][p])
            total, n = float(table["wsum"][p]), int(table["wn"][p])
            for i, (step, zi) in enumerate(zip(steps, z[:, c].tolist())):
                if not isfinite(zi):
                    continue
                if watch != _NEVER and step - watch > watch_steps:
                    watch = _NEVER                       # no lasting offset after this jump
                if watch == _NEVER:
                    if zi > jump_z:
                        watch, settled, total, n = step, False, 0.0, 0
                    continue
                if not settled:
                    if zi >= _SETTLE_Z:
                        continue                         # still the jump itself
                    settled = True
                total += min(max(zi, -_SETTLE_Z), _SETTLE_Z)
                n += 1
                stat = total / sqrt(n)
                if n >= min_steps and stat >= offset_z:
                    out.append(self._offset_finding(block, c, metric, step, watch, total / n, stat, n,
                                                    float(centre[i])))
                    watch = _NEVER
            table["watch"][p], table["settled"][p] = watch, settled
            table["wsum"][p], table["wn"][p] = total, n
        return out

    def _offset_finding(self, block: StepBlock, col: int, metric: str, step: int, jump: int,
                        mean_z: float, stat: float, n: int, centre: float) -> Finding:
        rank = int(block.ranks[col])
        pair = block.n_ranks == 2
        evidence: dict[str, Any] = {
            "reason": "lasting offset after a jump", "jump_step": jump, "direction": "high",
            "mean_z": {rank: mean_z}, "offset_sds": mean_z, "offset_stat": stat, "steps_after": n,
            "warning_level": self.offset_z,
            "peer_median": math.exp(centre) if math.isfinite(centre) else None,
        }
        if pair:
            evidence.update(direction="apart", pair=True, jumped=[rank], note=PAIR_NOTE)
        ranks = tuple(sorted(int(r) for r in block.ranks)) if pair else (rank,)
        return Finding(kind=self.kind, step=step, ranks=ranks, severity="warning",
                       score=float(excess_score(stat, self.offset_z, 2 * self.offset_z)),
                       metric=metric, onset_step=jump, evidence=evidence)

    def _global(self, block: StepBlock, metric: str, ref: np.ndarray) -> list[Finding]:
        x, present = block.values[metric], block.present[metric]
        table = self._tables[metric]
        at = table.index(block.ranks)
        if x.shape[1] and present.all():
            if bool((x == x[:, :1]).all()) and not (table["mean"][at] > 0).any():
                # The usual case: every rank holds the very same value at every step and none
                # has a share left to decay; nothing disagrees (NaN is not equal to itself).
                table["quiet"][at] = int(block.steps[-1])
                return []
        ref_valid = present[:, ref] & np.isfinite(x[:, ref])
        centre = cross_section(x[:, ref], ref_valid, None, self.min_ranks,
                               with_scale=False)[0]
        tol = self.rel_tol * np.abs(centre)
        with np.errstate(invalid="ignore"):
            # NaN compares False: a missing or non-finite cell never "differs".
            differs = (x > (centre + tol)[:, None]) | (x < (centre - tol)[:, None])
        # The shares are exactly zero for ranks that never disagreed: update only the others.
        sub = np.flatnonzero(differs.any(axis=0) | (table["mean"][at] > 0))
        if len(sub) == 0:
            table["quiet"][at] = int(block.steps[-1])
            return []
        with np.errstate(invalid="ignore"):
            judged = present[:, sub] & np.isfinite(x[:, sub]) & np.isfinite(centre)[:, None]
        p = _rows(at, sub)
        means = ewma_rows(differs[:, sub].astype(np.float32), judged, self._alpha, table["mean"][p],
                          zero_below=1e-12)
        table["mean"][p] = means[-1]
        return self._judge(block, metric, at, means, means, sub, judged,
                           # the weighted share after patience_steps straight disagreements
                           1.0 - (1.0 - self._alpha) ** self.patience_steps - 1e-6,
                           self.global_critical_share, centre=centre,
                           signed=False)

    # ----------------------------------------------------------------------- shared machine
    def _judge(self, block: StepBlock, metric: str, at: np.ndarray | slice, size: np.ndarray,
               means: np.ndarray, sub: np.ndarray | None, judged: np.ndarray | None, warn: float,
               crit: float, centre: np.ndarray, signed: bool,
               peak: np.ndarray | None = None) -> list[Finding]:
        """Episodes of ranks ``sub`` (block columns; None: every column) from their statistic
        ``size``; ``size``, ``means`` and ``judged`` have one column per entry of ``sub``. Ranks
        outside ``sub`` are known to sit at zero. ``at``: the block's rows in the tables
        (:meth:`RankTable.index`); ``peak``, if given: ``np.fmax.reduce(size, axis=0)``."""
        table = self._tables[metric]
        # Only ranks that come near the warning level (or are in an episode) need the machine:
        # a column's largest statistic tells (fmax: a NaN is never near, as in the comparison).
        local = (np.fmax.reduce(size, axis=0) if peak is None else peak) > warn / 2
        local |= table["active"][at if sub is None else _rows(at, sub)]
        local = np.flatnonzero(local)
        cols = local if sub is None else sub[local]
        p = _rows(at, cols)
        quiet_carry = table["quiet"][p]
        # Every other rank (not near the level at the last row, since that makes it local) was
        # last unremarkable at the block's last step; the local ones are set below.
        table["quiet"][at] = int(block.steps[-1])
        if len(local) == 0:
            return []
        s = size[:, local]
        near = s > warn / 2
        means = means[:, local]
        ok = np.ones(near.shape, dtype=bool) if judged is None else judged[:, local]   # judged is aligned with sub
        carry_active = table["active"][p]
        # Near the warning level but never past it, and no episode open (the usual case for the
        # few such ranks): nothing starts, escalates or ends. Only the run lengths and the last
        # unremarkable step move, to what the machine below would give them. (When the
        # critical level is not below the warning level, that holds rank by rank, so only the
        # others need the machine; otherwise it is taken for all or none, as it always was.)
        hot = carry_active | (s > warn).any(axis=0)
        calm = ~hot if crit >= warn else np.broadcast_to(~hot.any(), hot.shape)
        if calm.any():
            q = p[calm]
            table["run"][q] = np.where(ok[:, calm].any(axis=0), 0, table["run"][q])
            calm_step = np.where(~near[:, calm], block.steps[:, None], _MIN_STEP).max(axis=0)
            table["quiet"][q] = np.maximum(calm_step, quiet_carry[calm])
            table["active"][q] = False
            table["critical"][q] = False
            if calm.all():
                return []
            keep = ~calm
            cols, p, s, near, means, ok = cols[keep], p[keep], s[:, keep], near[:, keep], means[:, keep], ok[:, keep]
            quiet_carry, carry_active = quiet_carry[keep], carry_active[keep]
        active = hysteresis(s > warn, ~near, carry_active)
        runs = run_length(active, ok, table["run"][p])
        long = active & ok & (runs >= self._escalate_rows)
        critical = hysteresis((s > crit) | long, ~active, table["critical"][p])
        quiet = last_step_where(~near, block.steps, quiet_carry)
        prev_active, prev_crit = np.empty_like(active), np.empty_like(critical)
        prev_active[0], prev_active[1:] = carry_active, active[:-1]
        prev_crit[0], prev_crit[1:] = table["critical"][p], critical[:-1]
        table["active"][p], table["critical"][p] = active[-1], critical[-1]
        table["run"][p], table["quiet"][p] = runs[-1], quiet[-1]

        ids = block.ranks[cols]
        rising = active & ~prev_active
        escalate = critical & ~prev_crit & ~rising
        severe_at_entry = rising & critical
        falling = prev_active & ~active
        out: list[Finding] = []
        for i in np.flatnonzero((rising | escalate | falling).any(axis=1)):
            step = int(block.steps[i])
            entries: tuple[tuple[Severity, np.ndarray], ...] = (
                ("warning", rising[i] & ~severe_at_entry[i]), ("critical", severe_at_entry[i] | escalate[i]))
            for sev, mask in entries:
                if mask.any():
                    out.append(self._finding(step, metric, sev, ids[mask], means[i][mask],
                                             s[i][mask], quiet[i][mask], warn, crit, signed,
                                             float(centre[i]), bool(long[i][mask].any()),
                                             pair=signed and block.n_ranks == 2))
            if falling[i].any():
                out.append(Finding(kind=self.kind, step=step, metric=metric, severity="info",
                                   status="resolved", ranks=tuple(sorted(int(r) for r in ids[falling[i]])),
                                   evidence={"reason": "back with its peers"}))
        return out

    def _finding(self, step: int, metric: str, severity: Severity, ids: np.ndarray, mean: np.ndarray,
                 size: np.ndarray, quiet: np.ndarray, warn: float, crit: float, signed: bool,
                 centre: float, persistent: bool, pair: bool = False) -> Finding:
        ranks = tuple(sorted(int(r) for r in ids))
        top = int(np.argmax(size))
        onset = int(quiet.min()) + 1 if quiet.min() > _NEVER else None
        if signed:
            score = float(excess_score(size[top], warn, crit))
            evidence: dict[str, Any] = {
                "mean_z": {int(r): float(v) for r, v in zip(ids[:32], mean[:32])},
                "direction": "high" if mean[top] > 0 else "low",
                "peer_median": math.exp(centre) if math.isfinite(centre) else None,
            }
            if pair:
                evidence.update(direction="apart", pair=True, note=PAIR_NOTE)
        else:
            score = float(np.clip(size[top], 0.0, 1.0))
            evidence = {"disagreeing_share": {int(r): float(v) for r, v in zip(ids[:32], mean[:32])},
                        "peer_median": centre if math.isfinite(centre) else None,
                        "rel_tol": self.rel_tol}
        evidence.update(window_steps=self.window_steps, warning_level=warn, critical_level=crit,
                        persistent=persistent)
        return Finding(kind=self.kind, step=step, ranks=ranks, severity=severity, score=score,
                       metric=metric, onset_step=onset, evidence=evidence)

    # -------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {**{m: t.state_dict() for m, t in self._tables.items()},
                "peers": {m: p.state_dict() for m, p in self._peers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for m, t in self._tables.items():
            if m in state:
                t.load_state_dict(state[m])
        for m, p in self._peers.items():
            if m in state.get("peers", {}):
                p.load_state_dict(state["peers"][m])


def _rows(at: np.ndarray | slice, cols: np.ndarray) -> np.ndarray:
    """The table rows of block columns ``cols`` (``at`` from :meth:`RankTable.index`)."""
    return cols if isinstance(at, slice) else at[cols]
