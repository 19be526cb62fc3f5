"""The job-wide view of a spike: the cross-rank median against its trend-following baseline.

A step is a spike when the median's residual exceeds ``z_threshold`` robust sds and the value is
at least ``min_rise`` above the baseline; the episode then follows the severity policy of
:mod:`healthsvc_detectors.spike.detector` (transient, large, lasting, loss followed, recurring, escalated)
until it recovers or becomes the new baseline. The ranks it names are those the per-rank view
shows standing out at the spike's step.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from healthsvc_detectors.finding import Finding, Severity
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.stats.scales import excess_score
from healthsvc_detectors.stats.trend import RobustTrend

if TYPE_CHECKING:
    from healthsvc_detectors.spike.ranks import _RankView


class JobJudging:
    """The job-wide view of :class:`~healthsvc_detectors.spike.detector.SpikeDetector`: its episode, its
    baseline (``_trend``) and its findings."""

    # Declared for the type checker; the detector sets them.
    kind: str
    metric: str
    z_threshold: float
    min_rise: float
    exit_z: float
    confirm_steps: int
    large_ratio: float | None
    follow_metric: str | None
    follow_steps: int
    follow_rise: float
    recur_count: int | None
    recur_window_steps: int
    escalate_steps: int
    rebaseline_steps: int
    rank_z_threshold: float
    blame_fraction: float
    leading_signal: bool
    _trend: RobustTrend
    _episode: dict[str, Any] | None
    _first: float | None
    _starts: list[int]
    _follow: dict[str, Any] | None

    def _judge_job(self, block: StepBlock, job: np.ndarray, view: "_RankView | None",
                   ref: np.ndarray) -> tuple[list[Finding], set[int]]:
        out: list[Finding] = []
        rows: set[int] = set()
        trend = self._trend
        log_rise = math.log1p(self.min_rise)
        follow = _FollowSeries(self, block, ref)
        for i, y in enumerate(job.tolist()):   # scalar recursion: plain floats are fastest
            if self._follow is not None:
                out += self._check_follow(block, i, follow, y, trend, self._follow)
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
                if self.large_ratio is not None and self._large(y, pred, self.large_ratio):
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
                      trend: RobustTrend, fw: dict[str, Any]) -> list[Finding]:
        """A leading spike (``fw``: ``_follow``) becomes a warning when the loss follows it within
        follow_steps."""
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
        if self.large_ratio is not None and self._large(y, pred, self.large_ratio):
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

    def _large(self, y: float, pred: float, large_ratio: float) -> bool:
        if y - pred >= math.log(large_ratio):
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

    def _job_finding(self, step: int, ranks: tuple[int, ...], severity: Severity, z: float, y: float,
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


class _FollowSeries:
    """The job median of ``follow_metric`` on the rows a spike episode needs (computed lazily)."""

    def __init__(self, det: JobJudging, block: StepBlock, ref: np.ndarray) -> None:
        self.det, self.block, self.ref = det, block, ref
        self.on = det.follow_metric is not None and det.follow_metric in block.values

    def level(self, i: int) -> float | None:
        metric = self.det.follow_metric
        if not self.on or metric is None:   # (on implies a metric)
            return None
        x = self.block.values[metric][i, self.ref]
        ok = self.block.present[metric][i, self.ref] & (x > 0) & np.isfinite(x)
        return float(np.log(np.median(x[ok]))) if ok.any() else None
