"""``loss_spike`` and ``grad_spike``: a sudden jump above a robust baseline that follows the curve.

Two views of one metric, both in log space (a spike is a *ratio* above normal):

1. **The job** — the per-step median across ranks (``metric``: the loss, or the global
   ``grad_norm``) against a :class:`~detectors.robust.RobustTrend` baseline (level + trend, so it
   follows a decreasing training curve; robust scale; warm-up). A step is a spike when its
   residual exceeds ``z_threshold`` robust standard deviations *and* the value is at least
   ``min_rise`` above the baseline (``0.1`` = 10 %). Values judged anomalous are not learned, so
   a spike does not widen or lift the baseline. The finding blames the ranks that stand out from
   their peers at that step (cross-rank z above ``rank_z_threshold``) when they are few (at most
   ``blame_fraction`` of the reporting ranks), else nobody (run-wide).
2. **Single ranks** — each rank's ``rank_metric`` (the loss, or ``local_grad_norm``) against the
   cross-rank median of that step, in cross-rank robust sds. A rank more than
   ``rank_z_threshold`` sds and ``rank_min_rise`` above its peers while the job as a whole did not
   spike is reported with its rank named.

Lifecycle: the first spiking step fires (``warning``). If the value has not come back below
``exit_z`` sds within ``escalate_steps`` further observed steps, a ``critical`` finding
(``evidence.escalated``) follows at that step with ``onset_step`` = the spike's step. Recovery emits
a ``resolved`` finding (``info``). A shift that lasts ``rebaseline_steps`` is taken as the new
normal: the baseline re-anchors and a ``resolved`` finding says so (``evidence.reason``).

Score: ``(z - z_threshold) / z_threshold`` clipped to [0, 1]: 0 at the threshold, 1 at twice it.

The gradient norm usually jumps a few steps before the loss peaks; ``grad_spike`` findings carry
``evidence.leading_signal = True`` so alerting can treat a following ``loss_spike`` as its
consequence.

>>> from detectors.simulate import simulate_run, LossSpike
>>> run = simulate_run(n_steps=1_500, n_ranks=32, seed=3, faults=[LossSpike(step=1200, factor=1.5)])
>>> [(f.kind, f.step, f.severity, f.status) for f in LossSpikeDetector().update(run.block)]
[('loss_spike', 1200, 'warning', 'firing'), ('loss_spike', 1201, 'info', 'resolved')]
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.finding import Finding
from detectors.frame import StepBlock
from detectors.robust import (RankTable, RobustTrend, cross_section, excess_score, hysteresis,
                              log_positive, ReferenceRanks, run_length)

class SpikeDetector(Detector):
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
    escalate_steps: observed steps without recovery after which the spike turns critical.
    rebaseline_steps: observed steps after which a lasting shift becomes the new baseline.
    rank_z_threshold, rank_min_rise, rank_exit_z, rank_min_scale: the per-rank view's entry
        threshold (cross-rank robust sds), minimum rise above the peer median, exit threshold
        and scale floor (log units).
    blame_fraction: at most this share of ranks may stand out for a job-wide spike to name them.
    max_reference_ranks: ranks (chosen by id) used to estimate the cross-rank median and scale.
    min_ranks: fewest valid ranks for a per-rank judgement at a step.
    leading_signal: mark findings as a leading signal (the gradient norm leads the loss).
    """

    kind = "loss_spike"

    def __init__(self, kind: str = "loss_spike", metric: str = "loss",
                 rank_metric: str | None = "loss", z_threshold: float = 6.0,
                 min_rise: float = 0.1, exit_z: float = 2.0, warmup_steps: int = 50,
                 alpha: float = 0.1, beta: float = 0.1, scale_alpha: float = 0.02,
                 min_scale: float = 0.005, escalate_steps: int = 20,
                 rebaseline_steps: int = 200, rank_z_threshold: float = 8.0,
                 rank_min_rise: float = 0.5, rank_exit_z: float = 3.0,
                 rank_min_scale: float = 0.01, blame_fraction: float = 0.25,
                 max_reference_ranks: int = 256, min_ranks: int = 8,
                 leading_signal: bool = False) -> None:
        if kind not in ("loss_spike", "grad_spike"):
            raise ValueError(f"SpikeDetector kind must be 'loss_spike' or 'grad_spike', got {kind!r}")
        self.kind = kind
        self.metric, self.rank_metric = metric, rank_metric
        self.z_threshold, self.min_rise, self.exit_z = z_threshold, min_rise, exit_z
        self.warmup_steps = warmup_steps
        self.alpha, self.beta, self.scale_alpha, self.min_scale = alpha, beta, scale_alpha, min_scale
        self.escalate_steps, self.rebaseline_steps = escalate_steps, rebaseline_steps
        self.rank_z_threshold, self.rank_min_rise = rank_z_threshold, rank_min_rise
        self.rank_exit_z, self.rank_min_scale = rank_exit_z, rank_min_scale
        self.blame_fraction = blame_fraction
        self.max_reference_ranks, self.min_ranks = max_reference_ranks, min_ranks
        self.leading_signal = leading_signal
        super().__init__()

    def _reset(self) -> None:
        self._reference = ReferenceRanks(self.max_reference_ranks)
        self._trend = RobustTrend(alpha=self.alpha, beta=self.beta, scale_alpha=self.scale_alpha,
                                  warmup_steps=self.warmup_steps, min_scale=self.min_scale)
        self._episode: dict[str, Any] | None = None   # the job-wide spike in progress
        self._rows_seen = 0                             # rows with a per-rank judgement possible
        self._ranks = RankTable({"active": False, "run": 0, "covered": False})

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
            job = view.centre if view is not None and self.metric == self.rank_metric else None
            # The per-rank view needs ``min_ranks`` peers; the job-wide median does not (a small
            # job of 4 ranks still has a loss curve), so rows the view left empty get it directly.
            few = None if job is None else np.isnan(job)
            if job is None or few.any():
                yj, vj = log_positive(block.values[self.metric][:, ref], block.present[self.metric][:, ref])
                direct = cross_section(yj, vj, None, 1, with_scale=False)[0]
                job = direct if job is None else np.where(few, direct, job)
        else:
            job = np.full(n, np.nan)
        findings, spike_rows = self._judge_job(block, job, view)
        if view is not None:
            findings += self._judge_ranks(block, view, spike_rows)
        findings.sort(key=_order)
        return findings

    # ------------------------------------------------------------------------ job-wide view
    def _judge_job(self, block: StepBlock, job: np.ndarray,
                   view: "_RankView | None") -> tuple[list[Finding], set[int]]:
        out: list[Finding] = []
        rows: set[int] = set()
        trend = self._trend
        log_rise = math.log1p(self.min_rise)
        for i, y in enumerate(job.tolist()):   # scalar recursion: plain floats are fastest
            if y != y:          # NaN: nobody reported a usable value at this step
                continue
            step = int(block.steps[i])
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
                    self._episode = {"step": step, "len": 0, "peak_z": z, "baseline": pred, "ranks": list(ranks)}
                    out.append(self._job_finding(step, ranks, "warning", z, y, pred, sd,
                                                 {"ranks_standing_out": standing_out}))
                else:
                    trend.learn(y)
                continue
            ep["len"] += 1
            ep["peak_z"] = max(ep["peak_z"], z)
            ranks = tuple(ep["ranks"])
            if z < self.exit_z:
                out.append(self._resolved(step, ranks, ep, "recovered"))
                self._episode = None
                trend.learn(y)
            elif ep["len"] >= self.rebaseline_steps:
                out.append(self._resolved(step, ranks, ep, "rebaselined"))
                self._episode = None
                trend.restart(y)
            elif ep["len"] == self.escalate_steps:
                out.append(self._job_finding(step, ranks, "critical", z, y, pred, sd,
                                             {"escalated": True, "steps_without_recovery": ep["len"]},
                                             onset_step=ep["step"]))
        return out, rows

    def _standouts(self, block: StepBlock, view: "_RankView | None", i: int) -> tuple[tuple[int, ...], int]:
        """Ranks standing out from their peers at row ``i`` (named only when few)."""
        if view is None:
            return (), 0
        z = view.row_z(i)
        hot = z > self.rank_z_threshold
        k = int(hot.sum())
        reporting = int(np.isfinite(z).sum())
        if 0 < k <= self.blame_fraction * reporting:
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
                                 "peak_z": ep["peak_z"], "steps": ep["len"]})

    # ----------------------------------------------------------------------- per-rank view
    def _judge_ranks(self, block: StepBlock, view: "_RankView", spike_rows: set[int]) -> list[Finding]:
        judged_row = view.count >= self.min_ranks
        # Per-rank judgements start once the job has been watched for warmup_steps rows.
        seen = self._rows_seen + np.cumsum(judged_row)
        self._rows_seen = int(seen[-1])
        judged_row &= seen > self.warmup_steps
        pos = self._ranks.positions(block.ranks)
        carry_active = self._ranks["active"][pos]
        # Cheap screen on raw values over all ranks; exact work only on the few columns that
        # pass it or are in a spike already.
        screen = block.values[self.rank_metric] > np.where(judged_row, view.enter_value, np.inf)[:, None]
        cols = np.flatnonzero(screen.any(axis=0) | carry_active)
        if len(cols) == 0:
            return []
        y, valid = log_positive(block.values[self.rank_metric][:, cols],
                                block.present[self.rank_metric][:, cols])
        judged = valid & judged_row[:, None]
        rise = y - view.centre[:, None]
        z = rise / view.scale[:, None]
        enter = judged & (z > self.rank_z_threshold) & (rise > math.log1p(self.rank_min_rise))
        leave = judged & ~(z >= self.rank_exit_z)
        carry = carry_active[cols]
        active = hysteresis(enter, leave, carry)
        prev = np.vstack([carry[None, :], active[:-1]])
        runs = run_length(active, judged, self._ranks["run"][pos[cols]])
        rising = active & ~prev
        falling = prev & ~active
        # An episode that began at a job-wide spike row was reported by the job view (which names
        # these ranks); its per-rank escalation and resolution would only repeat it.
        at_spike = np.zeros(len(rising), dtype=bool)
        at_spike[sorted(spike_rows)] = True
        idx = np.arange(len(rising))[:, None]
        last_entry = np.maximum.accumulate(np.where(rising, idx, -1), axis=0)
        covered = np.where(last_entry >= 0, at_spike[np.maximum(last_entry, 0)],
                           self._ranks["covered"][pos[cols]][None, :])
        prev_covered = np.vstack([self._ranks["covered"][pos[cols]][None, :], covered[:-1]])
        self._ranks["active"][pos[cols]] = active[-1]
        self._ranks["run"][pos[cols]] = runs[-1]
        self._ranks["covered"][pos[cols]] = covered[-1]

        out: list[Finding] = []
        ranks = block.ranks[cols]
        escalating = active & judged & (runs == self.escalate_steps + 1) & ~covered
        falling &= ~prev_covered
        for i in np.flatnonzero((rising | falling | escalating).any(axis=1)):
            step = int(block.steps[i])
            if rising[i].any() and not at_spike[i]:
                out.append(self._rank_finding(ranks, rising[i], z[i], rise[i], "warning", step))
            if escalating[i].any():
                out.append(self._rank_finding(ranks, escalating[i], z[i], rise[i], "critical",
                                              step, escalated=True))
            if falling[i].any():
                gone = tuple(sorted(int(r) for r in ranks[falling[i]]))
                out.append(Finding(kind=self.kind, step=step, ranks=gone, severity="info",
                                   score=0.0, metric=self.rank_metric, status="resolved",
                                   evidence={"scope": "ranks", "reason": "recovered"}))
        return out

    def _rank_finding(self, ids: np.ndarray, cols: np.ndarray, row_z: np.ndarray,
                      row_rise: np.ndarray, severity: str, step: int, escalated: bool = False) -> Finding:
        ranks = tuple(sorted(int(r) for r in ids[cols]))
        z = float(np.max(row_z[cols]))
        evidence: dict[str, Any] = {
            "scope": "ranks", "rank_z": z, "ratio_to_peers": math.exp(float(np.max(row_rise[cols]))),
            "rank_z_threshold": self.rank_z_threshold, "count": len(ranks),
        }
        if escalated:
            evidence.update(escalated=True, steps_without_recovery=self.escalate_steps)
        if self.leading_signal:
            evidence["leading_signal"] = True
        return Finding(kind=self.kind, step=step, ranks=ranks, severity=severity,
                       score=float(excess_score(z, self.rank_z_threshold, 2 * self.rank_z_threshold)),
                       metric=self.rank_metric,
                       onset_step=step - self.escalate_steps if escalated else step,
                       evidence=evidence)

    # -------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"trend": self._trend.state_dict(), "episode": self._episode,
                "rows_seen": self._rows_seen, "ranks": self._ranks.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._trend.load_state_dict(state["trend"])
        self._episode = None if state["episode"] is None else dict(state["episode"])
        self._rows_seen = int(state["rows_seen"])
        self._ranks.load_state_dict(state["ranks"])


class _RankView:
    """Cross-rank centre and scale of ``rank_metric`` per row, from the reference ranks."""

    def __init__(self, det: SpikeDetector, block: StepBlock, ref: np.ndarray) -> None:
        self.block, self.metric = block, det.rank_metric
        y, valid = log_positive(block.values[self.metric][:, ref], block.present[self.metric][:, ref])
        self.centre, scale, self.count = cross_section(y, valid, None, det.min_ranks)
        self.scale = np.maximum(scale, det.rank_min_scale)
        # Raw value above which a cell may enter a spike (both entry conditions, in one bound).
        bound = np.maximum(math.log1p(det.rank_min_rise), det.rank_z_threshold * self.scale)
        self.enter_value = np.exp(self.centre + bound)

    def row_z(self, i: int) -> np.ndarray:
        y, _ = log_positive(self.block.values[self.metric][i], self.block.present[self.metric][i])
        return (y - self.centre[i]) / self.scale[i]


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
        super().__init__(kind="grad_spike", metric="grad_norm", rank_metric="local_grad_norm",
                         z_threshold=z_threshold, min_rise=min_rise, **kwargs)

    def params(self) -> dict[str, Any]:
        return _spike_params(self)


def _spike_params(det: SpikeDetector) -> dict[str, Any]:
    import inspect
    names = [p for p in inspect.signature(SpikeDetector.__init__).parameters if p != "self"]
    return {n: getattr(det, n) for n in names}
