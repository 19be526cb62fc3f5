"""``loss_spike`` and ``grad_spike``: a sudden jump above a robust baseline that follows the curve.

Two views of one metric, both in log space (a spike is a *ratio* above normal):

1. **The job**: the per-step median across ranks (``metric``: the loss, or the global
   ``grad_norm``) against a :class:`~detectors.stats.trend.RobustTrend` baseline (level + trend, so it
   follows a decreasing training curve; robust scale; warm-up). A step is a spike when its
   residual exceeds ``z_threshold`` robust standard deviations *and* the value is at least
   ``min_rise`` above the baseline (``0.1`` = 10 %). The level learns only values judged normal;
   the scale learns every value outside an episode, clipped, so it can neither collapse to its
   floor nor be widened by a spike. The finding blames the ranks that stand out from their usual
   place among their peers at that step when they are few (at most ``blame_fraction``).
2. **Single ranks**: each rank's ``rank_metric`` (the loss, or ``local_grad_norm``) against the
   cross-rank median, judged by the rank's own history of deviating from its peers
   (:class:`~detectors.peers.PeerDeviation`), so a 2-, 4- or 16,384-rank job needs no tuning and a
   rank's normal offset is not a spike. A rank more than ``rank_z_threshold`` of its own sds and
   ``rank_min_rise`` above where it usually sits, while the job as a whole did not spike, is
   reported with its rank named. With two ranks the deviations mirror; the one that rose is named.

**Severity means something** (the same policy in both views):

| what happened | severity |
|---|---|
| a spike that recovers within ``confirm_steps`` observed steps | ``info`` (recorded, no page) |
| the loss at least ``large_ratio`` x its baseline (2x), or back at its initialisation level | ``warning`` at once |
| a spike still not recovered after ``confirm_steps`` | ``warning`` (``evidence.reason = "lasting"``) |
| gradient norm only (``leading_signal``): the loss follows within ``follow_steps`` (+``follow_rise``) | ``warning`` (``"loss followed"``) |
| gradient norm only: the ``recur_count``-th spike within ``recur_window_steps`` | ``warning`` (``"recurring"``) |
| after ``escalate_steps`` still at least half its peak rise above the baseline | ``critical`` (``evidence.escalated``) |

Recovery (the residual below ``exit_z`` sds, or the rise below half of ``min_rise``) emits a
``resolved`` finding (``info``). A shift that lasts ``rebaseline_steps`` is taken as the new normal:
the baseline re-anchors and a ``resolved`` finding says so (``evidence.reason``). A large gradient
norm jump on its own stays ``info``: early in training a 3-4x jump for one step is normal.

Score: ``(z - z_threshold) / z_threshold`` clipped to [0, 1]: 0 at the threshold, 1 at twice it.

>>> from simulation import simulate_run, LossSpike
>>> run = simulate_run(n_steps=1_500, n_ranks=32, seed=3, faults=[LossSpike(step=1200, factor=1.5)])
>>> [(f.kind, f.step, f.severity, f.status) for f in LossSpikeDetector().update(run.block)]
[('loss_spike', 1200, 'info', 'firing'), ('loss_spike', 1201, 'info', 'resolved')]
>>> run = simulate_run(n_steps=1_500, n_ranks=32, seed=3, faults=[LossSpike(step=1200, factor=3.0)])
>>> [(f.kind, f.step, f.severity, f.status) for f in LossSpikeDetector().update(run.block)]
[('loss_spike', 1200, 'warning', 'firing'), ('loss_spike', 1201, 'info', 'resolved')]
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from detectors.base import BlockDetector, Detector
from detectors.finding import Finding
from detectors.frame import StepBlock
from detectors.peers import PeerDeviation
from detectors.stats.cross_section import ReferenceRanks, cross_section
from detectors.stats.machines import hysteresis, run_length
from detectors.stats.rank_table import RankTable
from detectors.stats.scales import excess_score, log_positive
from detectors.stats.trend import RobustTrend

class SpikeDetector(Detector, BlockDetector):
    """Sudden jumps of ``metric`` (job-wide) and ``rank_metric`` (per rank); see the module doc.

    Parameters (log-space quantities are natural-log units; 0.01 ~ 1 %)
    ----------
    kind: finding kind, ``"loss_spike"`` or ``"grad_spike"``.
    metric: the job-wide series (its cross-rank median per step is the signal).
    rank_metric: the per-rank series compared across ranks (None: no per-rank view).
    z_threshold: residual, in robust sds of the baseline, above which a step is a spike.
    min_rise: the value must also be at least this fraction above the baseline.
    exit_z: the spike has recovered when the residual falls below this many sds.
    warmup_steps: observed steps learned before judging (the baseline settles meanwhile).
    alpha, beta, scale_alpha, min_scale: baseline gains and scale floor (see RobustTrend).
    confirm_steps: observed steps a spike may last and still be transient (``info``).
    large_ratio: a value at least this many times its baseline (or back at the first value of the
        run, once the curve has fallen well below it) is a ``warning`` at once; None: never (a
        gradient norm's size alone says little).
    follow_metric, follow_steps, follow_rise: a spike of ``metric`` is a ``warning`` when the job
        median of ``follow_metric`` rises ``follow_rise`` above its level at the spike within
        ``follow_steps`` steps (None: off).
    recur_count, recur_window_steps: the ``recur_count``-th spike within ``recur_window_steps``
        steps is a ``warning`` (None: off).
    escalate_steps: observed steps without recovery after which the spike turns critical (if it
        is still at least half its peak rise above the baseline).
    rebaseline_steps: observed steps after which a lasting shift becomes the new baseline.
    rank_z_threshold, rank_min_rise, rank_exit_z, rank_min_scale: the per-rank view's entry
        threshold (the rank's own sds of its deviation from its peers), minimum rise above where
        it usually sits, exit threshold and scale floor (log units).
    rank_warmup_steps: values of a rank learned before its deviations are judged.
    blame_fraction: at most this share of ranks may stand out for a job-wide spike to name them.
    max_reference_ranks: ranks (chosen by id) used to estimate the cross-rank median.
    min_ranks: fewest valid ranks for a per-rank judgement at a step (2: any job with peers).
    leading_signal: mark findings as a leading signal (the gradient norm leads the loss).
    """

    kind = "loss_spike"

    def __init__(self, kind: str = "loss_spike", metric: str = "loss",
                 rank_metric: str | None = "loss", z_threshold: float = 6.0,
                 min_rise: float = 0.1, exit_z: float = 2.0, warmup_steps: int = 50,
                 alpha: float = 0.1, beta: float = 0.1, scale_alpha: float = 0.02,
                 min_scale: float = 0.005, confirm_steps: int = 5,
                 large_ratio: float | None = 2.0, follow_metric: str | None = None,
                 follow_steps: int = 5, follow_rise: float = 0.1,
                 recur_count: int | None = None, recur_window_steps: int = 50,
                 escalate_steps: int = 20, rebaseline_steps: int = 200,
                 rank_z_threshold: float = 8.0, rank_min_rise: float = 0.5,
                 rank_exit_z: float = 3.0, rank_min_scale: float = 0.01,
                 rank_warmup_steps: int = 50, blame_fraction: float = 0.25,
                 max_reference_ranks: int = 256, min_ranks: int = 2,
                 leading_signal: bool = False) -> None:
        if kind not in ("loss_spike", "grad_spike"):
            raise ValueError(f"SpikeDetector kind must be 'loss_spike' or 'grad_spike', got {kind!r}")
        if min_ranks < 2:
            raise ValueError(f"min_ranks must be >= 2 (a rank needs a peer), got {min_ranks}")
        self.kind = kind
        self.metric, self.rank_metric = metric, rank_metric
        self.z_threshold, self.min_rise, self.exit_z = z_threshold, min_rise, exit_z
        self.warmup_steps = warmup_steps
        self.alpha, self.beta, self.scale_alpha, self.min_scale = alpha, beta, scale_alpha, min_scale
        self.confirm_steps, self.large_ratio = confirm_steps, large_ratio
        self.follow_metric, self.follow_steps, self.follow_rise = follow_metric, follow_steps, follow_rise
        self.recur_count, self.recur_window_steps = recur_count, recur_window_steps
        self.escalate_steps, self.rebaseline_steps = escalate_steps, rebaseline_steps
        self.rank_z_threshold, self.rank_min_rise = rank_z_threshold, rank_min_rise
        self.rank_exit_z, self.rank_min_scale = rank_exit_z, rank_min_scale
        self.rank_warmup_steps = rank_warmup_steps
        self.blame_fraction = blame_fraction
        self.max_reference_ranks, self.min_ranks = max_reference_ranks, min_ranks
        self.leading_signal = leading_signal
        super().__init__()

    def peer_deviations(self) -> dict[str, PeerDeviation]:
        """The per-rank trackers by metric (the suite may share one with another detector)."""
        return {} if self.rank_metric is None else {self.rank_metric: self._peers}

    def use_peer_deviation(self, metric: str, tracker: PeerDeviation) -> None:
        if metric == self.rank_metric:
            self._peers = tracker

    def _reset(self) -> None:
        self._reference = ReferenceRanks(self.max_reference_ranks)
        self._trend = RobustTrend(alpha=self.alpha, beta=self.beta, scale_alpha=self.scale_alpha,
                                  warmup_steps=self.warmup_steps, min_scale=self.min_scale)
        self._episode: dict[str, Any] | None = None   # the job-wide spike in progress
        self._first: float | None = None               # the first job value (initialisation level)
        self._starts: list[int] = []                    # steps of recent job-wide spikes
        self._follow: dict[str, Any] | None = None      # a leading spike whose consequence we await
        if getattr(self, "_peers", None) is not None and self._peers.shared:
            self._peers.reset()
        else:
            self._peers = PeerDeviation(warmup_steps=self.rank_warmup_steps, min_scale=self.rank_min_scale)
        self._ranks = RankTable({"active": False, "run": 0, "covered": False, "warned": False,
                                 "peak": 0.0})

    # ------------------------------------------------------------------------------- update
    def update(self, block: StepBlock) -> list[Finding]:
        if block.n_steps == 0:
            return []
        # NaN rows (nobody reported) flow through the arithmetic on purpose: one errstate here
        # instead of one per operation (each costs microseconds on one-step blocks).
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self._update(block)

    def _update(self, block: StepBlock) -> list[Finding]:
        n = block.n_steps
        ref = self._reference(block.ranks)
        view = None
        if self.rank_metric is not None and self.rank_metric in block.values:
            view = _RankView(self, block, ref)
        if self.metric in block.values:
            if view is not None and self.metric == self.rank_metric:
                job = view.centre
            else:
                job = self._job_centre(block, ref)
        else:
            job = np.full(n, np.nan)
        findings, spike_rows = self._judge_job(block, job, view, ref)
        if view is not None:
            findings += self._judge_ranks(block, view, spike_rows)
        findings.sort(key=_order)
        return findings

    def _job_centre(self, block: StepBlock, ref: np.ndarray) -> np.ndarray:
        """Per row, the cross-rank median of the log of ``metric`` over the reference ranks."""
        x, present = block.values[self.metric], block.present[self.metric]
        if present.all() and bool((x.min(axis=1) == x.max(axis=1)).all()):
            # An all-reduced value (grad_norm): every rank holds the very same number, which is
            # its own median; two row reductions instead of a gather, a log and a sort per row
            # (NaN fails ==, so a row with one takes the general path).
            first = x[:, 0]
            job = np.full(len(first), np.nan)
            np.log(first, out=job, where=(first > 0) & (first < np.inf))
            return job
        yj, vj = log_positive(x[:, ref], present[:, ref])
        return cross_section(yj, vj, None, 1, with_scale=False)[0]

    # ------------------------------------------------------------------------ job-wide view
    def _judge_job(self, block: StepBlock, job: np.ndarray, view: "_RankView | None",
                   ref: np.ndarray) -> tuple[list[Finding], set[int]]:
        out: list[Finding] = []
        rows: set[int] = set()
        trend = self._trend
        log_rise = math.log1p(self.min_rise)
        follow = _FollowSeries(self, block, ref)
        for i, y in enumerate(job.tolist()):   # scalar recursion: plain floats are fastest
            if self._follow is not None:
                out += self._check_follow(block, i, follow, y, trend)
            if y != y:          # NaN: nobody reported a usable value at this step
                continue
            step = int(block.steps[i])
            if self._first is None:
                self._first = y
            if not trend.warm:
                trend.learn(y)
                continue
            pred, sd = trend.predict(), trend.sd()
            z = (y - pred) / sd
            ep = self._episode
            if ep is None:
                if z > self.z_threshold and y - pred > log_rise:
                    rows.add(i)
                    ranks, standing_out = self._standouts(block, view, i)
                    self._starts = [s for s in self._starts if s > step - self.recur_window_steps]
                    reason = self._serious_at_entry(step, y, pred)
                    if reason is None and ranks and self._ranks_large(block, view, i, ranks):
                        reason = "large"     # the ranks it names rose that much (a small job's median moves less)
                    self._starts.append(step)
                    self._episode = {"step": step, "len": 0, "peak_z": z, "peak_rise": y - pred,
                                     "baseline": pred, "ranks": list(ranks),
                                     "serious": reason is not None, "follow_level": follow.level(i)}
                    out.append(self._job_finding(step, ranks, "info" if reason is None else "warning",
                                                 z, y, pred, sd, {"ranks_standing_out": standing_out,
                                                                  "reason": reason or "transient"}))
                    if reason is None and follow.on:
                        # Watch the loss for follow_steps, even if this spike is over by then.
                        self._follow = {"step": step, "level": self._episode["follow_level"],
                                        "ranks": list(ranks)}
                    trend.learn_scale(y)
                else:
                    trend.learn(y)
                continue
            ep["len"] += 1
            ep["peak_z"] = max(ep["peak_z"], z)
            ep["peak_rise"] = max(ep["peak_rise"], y - pred)
            ranks = tuple(ep["ranks"])
            if z < self.exit_z or y - pred < log_rise / 2:
                out.append(self._resolved(step, ranks, ep, "recovered"))
                self._episode = None
                trend.learn(y)
                continue
            if ep["len"] >= self.rebaseline_steps:
                out.append(self._resolved(step, ranks, ep, "rebaselined"))
                self._episode = None
                trend.restart(y)
                continue
            if not ep["serious"]:
                reason = None
                if self.large_ratio is not None and self._large(y, pred):
                    reason = "large"
                elif ep["len"] >= self.confirm_steps:
                    reason = "lasting"
                if reason is not None:
                    self._follow = None
                    ep["serious"] = True
                    out.append(self._job_finding(step, ranks, "warning", z, y, pred, sd,
                                                 {"reason": reason, "steps_since_spike": ep["len"]},
                                                 onset_step=ep["step"]))
            if ep["len"] == self.escalate_steps and y - pred >= max(log_rise, ep["peak_rise"] / 2):
                out.append(self._job_finding(step, ranks, "critical", z, y, pred, sd,
                                             {"escalated": True, "reason": "not recovering",
                                              "steps_without_recovery": ep["len"]},
                                             onset_step=ep["step"]))
        return out, rows

    def _check_follow(self, block: StepBlock, i: int, follow: "_FollowSeries", y: float,
                      trend: RobustTrend) -> list[Finding]:
        """A leading spike becomes a warning when the loss follows it within follow_steps."""
        fw = self._follow
        step = int(block.steps[i])
        if step <= fw["step"]:
            return []
        if step - fw["step"] > self.follow_steps or fw["level"] is None:
            self._follow = None
            return []
        now = follow.level(i)
        if now is None or now - fw["level"] < math.log1p(self.follow_rise):
            return []
        self._follow = None
        ep = self._episode
        if ep is not None and ep["step"] == fw["step"]:
            ep["serious"] = True
        pred, sd = trend.predict(), trend.sd()
        value = y if y == y else pred
        return [self._job_finding(step, tuple(fw["ranks"]), "warning", (value - pred) / sd, value, pred, sd,
                                  {"reason": "loss followed", "spike_step": fw["step"],
                                   "loss_rise": math.exp(now - fw["level"])}, onset_step=fw["step"])]

    def _serious_at_entry(self, step: int, y: float, pred: float) -> str | None:
        """Why a fresh spike is a warning at once (None: it is ``info`` until it lasts)."""
        if self.large_ratio is not None and self._large(y, pred):
            return "large"
        if self.recur_count is not None and len(self._starts) + 1 >= self.recur_count:
            return "recurring"
        return None

    def _ranks_large(self, block: StepBlock, view: "_RankView | None", i: int,
                     ranks: tuple[int, ...]) -> bool:
        if self.large_ratio is None or view is None:
            return False
        cols = np.searchsorted(block.ranks, np.asarray(ranks))
        rise = view.rise[i, cols]
        return bool(np.nanmax(rise) >= math.log(self.large_ratio)) if np.isfinite(rise).any() else False

    def _large(self, y: float, pred: float) -> bool:
        if y - pred >= math.log(self.large_ratio):
            return True
        # Back at the initialisation level (a blow-up), once the curve had left it well behind.
        first = self._first
        return first is not None and pred < first - math.log(1.5) and y >= first - math.log(1.1)

    def _standouts(self, block: StepBlock, view: "_RankView | None", i: int) -> tuple[tuple[int, ...], int]:
        """Ranks standing out from their usual place among peers at row ``i`` (named when few)."""
        if view is None:
            return (), 0
        z = view.z[i]
        hot = z > self.rank_z_threshold
        k = int(hot.sum())
        reporting = int(np.isfinite(z).sum())
        # A few means at most blame_fraction of them, and always one (with 2 ranks, the one that
        # rose is the story).
        if 0 < k <= max(1.0, self.blame_fraction * reporting):
            return tuple(sorted(int(r) for r in block.ranks[hot])), k
        return (), k

    def _job_finding(self, step: int, ranks: tuple[int, ...], severity: str, z: float, y: float,
                     pred: float, sd: float, extra: dict[str, Any],
                     onset_step: int | None = None) -> Finding:
        evidence = {
            "scope": "job", "value": math.exp(y), "baseline": math.exp(pred),
            "ratio": math.exp(y - pred), "z": z, "baseline_sd_log": sd,
            "z_threshold": self.z_threshold, **extra,
        }
        if self.leading_signal:
            evidence["leading_signal"] = True
        return Finding(kind=self.kind, step=step, ranks=ranks, severity=severity,
                       score=float(excess_score(z, self.z_threshold, 2 * self.z_threshold)),
                       metric=self.metric, onset_step=step if onset_step is None else onset_step,
                       evidence=evidence)

    def _resolved(self, step: int, ranks: tuple[int, ...], ep: dict[str, Any], reason: str) -> Finding:
        return Finding(kind=self.kind, step=step, ranks=ranks, severity="info", score=0.0,
                       metric=self.metric, status="resolved", onset_step=ep["step"],
                       evidence={"scope": "job", "reason": reason, "spike_step": ep["step"],
                                 "peak_z": ep["peak_z"], "steps": ep["len"],
                                 "was_serious": ep["serious"]})

    # ----------------------------------------------------------------------- per-rank view
    def _judge_ranks(self, block: StepBlock, view: "_RankView", spike_rows: set[int]) -> list[Finding]:
        pos = self._ranks.positions(block.ranks)
        carry_active = self._ranks["active"][pos]
        # Usually no cell passes the threshold (the rows' maxima say so) and no rank is in an
        # episode: nothing to do. Otherwise one pass over the cells (NaN, not judged, compares
        # False), and the exact work only on the few columns that pass it or are in an episode.
        if not (view.z_row_max > self.rank_z_threshold).any() and not carry_active.any():
            return []
        hot = (view.z > self.rank_z_threshold).any(axis=0) | carry_active
        if not hot.any():
            return []
        cols = np.flatnonzero(hot)
        z, rise = view.z[:, cols].astype(np.float64), view.rise[:, cols].astype(np.float64)
        judged = np.isfinite(z)
        enter = judged & (z > self.rank_z_threshold) & (rise > math.log1p(self.rank_min_rise))
        p = pos[cols]
        leave = judged & ~(z >= self.rank_exit_z)
        carry = carry_active[cols]
        active = hysteresis(enter, leave, carry)
        prev = np.vstack([carry[None, :], active[:-1]])
        runs = run_length(active, judged, self._ranks["run"][p])
        rising = active & ~prev
        falling = prev & ~active
        # An episode that began at a job-wide spike row was reported by the job view (which names
        # these ranks); the per-rank view would only repeat it.
        at_spike = np.zeros(len(rising), dtype=bool)
        at_spike[sorted(spike_rows)] = True
        idx = np.arange(len(rising))[:, None]
        last_entry = np.maximum.accumulate(np.where(rising, idx, -1), axis=0)
        entered_here = last_entry >= 0
        entry_row = np.maximum(last_entry, 0)
        covered = np.where(entered_here, at_spike[entry_row], self._ranks["covered"][p][None, :])
        large = np.zeros_like(rising)
        if self.large_ratio is not None:
            large = rising & (rise >= math.log(self.large_ratio))
        col = np.arange(len(cols))[None, :]
        warned_at_entry = np.where(entered_here, large[entry_row, col], self._ranks["warned"][p][None, :])
        confirm = active & judged & (runs == self.confirm_steps + 1) & ~covered & ~warned_at_entry
        # Each episode's peak rise so far (restarting at its entry): it escalates only if it has not
        # come down to half of it, as the job view does.
        episode = np.cumsum(rising, axis=0)
        r_act = np.where(active & judged, rise, -np.inf)
        keyed = np.vstack([np.where(np.isfinite(self._ranks["peak"][p]), self._ranks["peak"][p], -np.inf)[None, :],
                           r_act]) + 1e6 * np.vstack([np.zeros((1, len(cols))), episode])
        peak = (np.maximum.accumulate(keyed, axis=0) - 1e6 * np.vstack([np.zeros((1, len(cols))), episode]))[1:]
        escalating = (active & judged & (runs == self.escalate_steps + 1) & ~covered
                      & (rise >= np.maximum(math.log1p(self.rank_min_rise), peak / 2)))
        prev_covered = np.vstack([self._ranks["covered"][p][None, :], covered[:-1]])
        falling &= ~prev_covered
        self._ranks["active"][p] = active[-1]
        self._ranks["peak"][p] = np.where(active[-1], np.maximum(peak[-1], 0.0), 0.0)
        self._ranks["run"][p] = runs[-1]
        self._ranks["covered"][p] = covered[-1]
        last_confirm = np.maximum.accumulate(np.where(confirm, idx, -1), axis=0)
        self._ranks["warned"][p] = warned_at_entry[-1] | (last_confirm[-1] > last_entry[-1])

        out: list[Finding] = []
        ranks = block.ranks[cols]
        for i in np.flatnonzero((rising | falling | confirm | escalating).any(axis=1)):
            step = int(block.steps[i])
            if rising[i].any() and not at_spike[i]:
                for sev, mask in (("warning", rising[i] & large[i]), ("info", rising[i] & ~large[i])):
                    if mask.any():
                        out.append(self._rank_finding(ranks, mask, z[i], rise[i], sev, step,
                                                      "large" if sev == "warning" else "transient"))
            if confirm[i].any():
                out.append(self._rank_finding(ranks, confirm[i], z[i], rise[i], "warning",
                                              step - self.confirm_steps, "lasting", at=step))
            if escalating[i].any():
                out.append(self._rank_finding(ranks, escalating[i], z[i], rise[i], "critical",
                                              step - self.escalate_steps, "not recovering", at=step))
            if falling[i].any():
                gone = tuple(sorted(int(r) for r in ranks[falling[i]]))
                out.append(Finding(kind=self.kind, step=step, ranks=gone, severity="info",
                                   score=0.0, metric=self.rank_metric, status="resolved",
                                   evidence={"scope": "ranks", "reason": "recovered"}))
        return out

    def _rank_finding(self, ids: np.ndarray, cols: np.ndarray, row_z: np.ndarray,
                      row_rise: np.ndarray, severity: str, onset: int, reason: str,
                      at: int | None = None) -> Finding:
        ranks = tuple(sorted(int(r) for r in ids[cols]))
        z = float(np.max(row_z[cols]))
        evidence: dict[str, Any] = {
            "scope": "ranks", "rank_z": z, "ratio_to_usual": math.exp(float(np.max(row_rise[cols]))),
            "rank_z_threshold": self.rank_z_threshold, "count": len(ranks), "reason": reason,
        }
        if severity == "critical":
            evidence.update(escalated=True, steps_without_recovery=self.escalate_steps)
        if self.leading_signal:
            evidence["leading_signal"] = True
        return Finding(kind=self.kind, step=onset if at is None else at, ranks=ranks, severity=severity,
                       score=float(excess_score(z, self.rank_z_threshold, 2 * self.rank_z_threshold)),
                       metric=self.rank_metric, onset_step=onset, evidence=evidence)

    # -------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"trend": self._trend.state_dict(), "episode": self._episode, "first": self._first,
                "starts": list(self._starts), "follow": self._follow, "peers": self._peers.state_dict(),
                "ranks": self._ranks.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._trend.load_state_dict(state["trend"])
        self._episode = None if state["episode"] is None else dict(state["episode"])
        self._first = state.get("first")
        self._starts = [int(s) for s in state.get("starts", [])]
        self._follow = None if state.get("follow") is None else dict(state["follow"])
        self._peers.load_state_dict(state["peers"])
        self._ranks.load_state_dict(state["ranks"])


class _RankView:
    """Per row: the cross-rank centre of ``rank_metric`` (log), and each rank's deviation from it
    judged by its own history (``z`` in its own sds, ``rise`` beyond its usual offset); rows with
    fewer than ``min_ranks`` usable ranks are not judged per rank."""

    def __init__(self, det: SpikeDetector, block: StepBlock, ref: np.ndarray) -> None:
        v = det._peers.view(block, det.rank_metric, ref)
        self.centre = v.centre
        self.z, self.rise, self.z_row_max = v.z, v.rise, v.z_row_max
        few = v.count < det.min_ranks
        pair = v.count == 2
        if few.any() or pair.any():
            self.z, self.rise = self.z.copy(), self.rise.copy()
            self.z[few], self.rise[few] = np.nan, np.nan
            # Of two ranks the centre is their mean: a rank's rise over its one peer is twice its
            # deviation from the centre (what "2x its peers" means for the size rules).
            self.rise[pair & ~few] *= 2.0


class _FollowSeries:
    """The job median of ``follow_metric`` on the rows a spike episode needs (computed lazily)."""

    def __init__(self, det: SpikeDetector, block: StepBlock, ref: np.ndarray) -> None:
        self.det, self.block, self.ref = det, block, ref
        self.on = det.follow_metric is not None and det.follow_metric in block.values

    def level(self, i: int) -> float | None:
        if not self.on:
            return None
        x = self.block.values[self.det.follow_metric][i, self.ref]
        ok = self.block.present[self.det.follow_metric][i, self.ref] & (x > 0) & np.isfinite(x)
        return float(np.log(np.median(x[ok]))) if ok.any() else None



def _order(f: Finding) -> tuple:
    return (f.step, f.status != "firing", f.severity, f.metric or "", f.ranks)


class LossSpikeDetector(SpikeDetector):
    """``loss_spike``: the median loss across ranks jumps; or some ranks' loss jumps above peers."""

    def __init__(self, z_threshold: float = 6.0, min_rise: float = 0.1, **kwargs: Any) -> None:
        super().__init__(kind="loss_spike", metric="loss", rank_metric="loss",
                         z_threshold=z_threshold, min_rise=min_rise, **kwargs)

    def params(self) -> dict[str, Any]:
        return _spike_params(self)


class GradSpikeDetector(SpikeDetector):
    """``grad_spike``: the global gradient norm jumps (a leading signal of a loss spike); or some
    ranks' ``local_grad_norm`` jumps above their peers'."""

    def __init__(self, z_threshold: float = 6.0, min_rise: float = 0.5, **kwargs: Any) -> None:
        kwargs.setdefault("leading_signal", True)
        kwargs.setdefault("large_ratio", None)        # size alone: a leading signal, not a page
        kwargs.setdefault("follow_metric", "loss")
        kwargs.setdefault("recur_count", 3)
        super().__init__(kind="grad_spike", metric="grad_norm", rank_metric="local_grad_norm",
                         z_threshold=z_threshold, min_rise=min_rise, **kwargs)

    def params(self) -> dict[str, Any]:
        return _spike_params(self)


def _spike_params(det: SpikeDetector) -> dict[str, Any]:
    import inspect
    names = [p for p in inspect.signature(SpikeDetector.__init__).parameters if p != "self"]
    return {n: getattr(det, n) for n in names}
