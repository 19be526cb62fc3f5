"""``rank_outlier``: a rank whose values disagree persistently with its peers.

The cheap silent-corruption tell that needs no re-run. Data-parallel ranks see different
micro-batches of the same distribution, so over many steps every rank's loss and local gradient
norm should sit, on average, where its peers' do; and the global gradient norm after the
all-reduce should be the very same number on every rank.

**Distribution metrics** (``metrics``, default ``local_grad_norm`` and ``loss``): each step, each
rank's value in log space becomes a cross-rank robust z against that step's median and IQR-based
sd (estimated on at most ``max_reference_ranks`` ranks chosen by id), clipped to ``±z_clip`` so one
wild step counts as a few sds, not a thousand. A per-rank exponentially weighted mean of that z
(gain ``1 / window_steps``) is the evidence: under the null it stays within about
``sqrt(1 / (2 window_steps))`` sds of zero (0.07 for 100 steps); a rank whose mean passes
``z_warning`` in either direction fires ``warning``, past ``z_critical`` ``critical``; it resolves
below ``z_warning / 2``. A 3x local gradient norm (z ~ 10) fires within ~10 steps; a loss biased by
5 % with a 4 % micro-batch spread (z ~ 1.2) within ~70.

**Global metrics** (``global_metrics``, default ``grad_norm``): a rank whose value differs from the
step's cross-rank median by more than ``rel_tol`` (relative) disagrees. The per-rank weighted
share of disagreeing steps fires ``warning`` once it equals ``patience_steps`` consecutive
disagreements (one isolated glitch is not enough), ``critical`` past ``global_critical_share``.

Every kind of episode turns ``critical`` once it has lasted ``escalate_steps`` observed steps.
``onset_step`` is the first step after the rank was last unremarkable (its statistic below half
the warning level). Missing cells leave a rank's state untouched; new ranks start from zero.

Score: distribution metrics ``(|mean z| - z_warning) / (z_critical - z_warning)``; global metrics
the weighted share of disagreeing steps; both clipped to [0, 1].

>>> from detectors.simulate import simulate_run, CorruptRank
>>> run = simulate_run(n_steps=1_000, n_ranks=32, seed=2, faults=[CorruptRank(step=600, rank=9)])
>>> [(f.metric, f.step, f.ranks, f.severity, f.onset_step) for f in RankOutlierDetector().update(run.block)]
[('local_grad_norm', 612, (9,), 'warning', 606), ('local_grad_norm', 642, (9,), 'critical', 606)]
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.finding import Finding
from detectors.frame import StepBlock
from detectors.robust import (RankTable, cross_section, excess_score, hysteresis, last_step_where,
                              log_positive, reference_positions, run_length)

_NEVER = -(2 ** 62)   # "no quiet step seen yet"


class RankOutlierDetector(Detector):
    """One rank's values disagree with its peers' for many steps (see the module doc).

    Parameters
    ----------
    metrics: per-rank metrics compared with the peer distribution (log space).
    global_metrics: metrics that must be identical on all ranks.
    window_steps: memory of the per-rank weighted means, in steps (gain 1 / window_steps).
    z_warning, z_critical: weighted-mean z (cross-rank robust sds) for warning and critical.
    z_clip: per-step z is clipped to +-z_clip before averaging.
    min_scale: floor of the cross-rank sd, log units (0.01 ~ 1 %): identical values are not
        outliers of each other because of rounding.
    rel_tol: relative difference from the median at which a global value disagrees.
    patience_steps: consecutive disagreements (equivalently weighted share) to fire for globals.
    global_critical_share: weighted share of disagreeing steps at which a global turns critical
        (0.5 = about half of the recent window; a constant disagreement gets there in ~70 steps).
    escalate_steps: observed steps an episode lasts before it turns critical.
    max_reference_ranks: ranks (chosen by id) used for the per-step median and sd.
    min_ranks: fewest reporting ranks for a step to be judged.
    """

    kind = "rank_outlier"

    def __init__(self, metrics: tuple[str, ...] = ("local_grad_norm", "loss"),
                 global_metrics: tuple[str, ...] = ("grad_norm",), window_steps: int = 100,
                 z_warning: float = 0.6, z_critical: float = 2.0, z_clip: float = 6.0,
                 min_scale: float = 0.01, rel_tol: float = 1e-3, patience_steps: int = 3,
                 global_critical_share: float = 0.5, escalate_steps: int = 300, max_reference_ranks: int = 256,
                 min_ranks: int = 8) -> None:
        self.metrics, self.global_metrics = tuple(metrics), tuple(global_metrics)
        self.window_steps = window_steps
        self.z_warning, self.z_critical, self.z_clip = z_warning, z_critical, z_clip
        self.min_scale, self.rel_tol, self.patience_steps = min_scale, rel_tol, patience_steps
        self.global_critical_share = global_critical_share
        self.escalate_steps = escalate_steps
        self.max_reference_ranks, self.min_ranks = max_reference_ranks, min_ranks
        super().__init__()

    def _reset(self) -> None:
        fields = {"mean": 0.0, "active": False, "critical": False, "run": 0, "quiet": _NEVER}
        self._tables = {m: RankTable(fields) for m in (*self.metrics, *self.global_metrics)}

    @property
    def _alpha(self) -> float:
        return 1.0 / self.window_steps

    @property
    def _global_warning(self) -> float:
        # The weighted share after patience_steps consecutive disagreements from zero.
        return 1.0 - (1.0 - self._alpha) ** self.patience_steps - 1e-12

    # ------------------------------------------------------------------------------- update
    def update(self, block: StepBlock) -> list[Finding]:
        if block.n_steps == 0:
            return []
        ref = reference_positions(block.ranks, self.max_reference_ranks)
        findings: list[Finding] = []
        for m in self.metrics:
            if m in block.values:
                findings += self._distribution(block, m, ref)
        for m in self.global_metrics:
            if m in block.values:
                findings += self._global(block, m, ref)
        findings.sort(key=lambda f: (f.step, f.status != "firing", f.metric or "", f.severity, f.ranks))
        return findings

    def _distribution(self, block: StepBlock, metric: str, ref: np.ndarray) -> list[Finding]:
        y, valid = log_positive(block.values[metric], block.present[metric])
        centre, scale, count = cross_section(y, valid, ref, self.min_ranks)
        judged = valid & (count >= self.min_ranks)[:, None]
        with np.errstate(invalid="ignore"):
            z = (y - centre[:, None]) / np.maximum(scale, self.min_scale)[:, None]
        np.clip(z, -self.z_clip, self.z_clip, out=z)
        return self._judge(block, metric, z, judged, self.z_warning, self.z_critical,
                           extra={"centre": centre})

    def _global(self, block: StepBlock, metric: str, ref: np.ndarray) -> list[Finding]:
        x = block.values[metric]
        valid = block.present[metric] & np.isfinite(x)
        centre = cross_section(x, valid, ref, self.min_ranks, with_scale=False)[0]
        judged = valid & np.isfinite(centre)[:, None]
        with np.errstate(invalid="ignore"):
            differs = np.abs(x - centre[:, None]) > self.rel_tol * np.abs(centre)[:, None]
        return self._judge(block, metric, (differs & judged).astype(np.float64), judged,
                           self._global_warning, self.global_critical_share,
                           extra={"centre": centre}, signed=False)

    # ----------------------------------------------------------------------- shared machine
    def _judge(self, block: StepBlock, metric: str, stat: np.ndarray, judged: np.ndarray,
               warn: float, crit: float, extra: dict[str, np.ndarray],
               signed: bool = True) -> list[Finding]:
        table = self._tables[metric]
        pos = table.positions(block.ranks)
        means = _ewma(stat, judged, self._alpha, table["mean"][pos])
        table["mean"][pos] = means[-1]
        size = np.abs(means) if signed else means
        carry_active = table["active"][pos]
        # Only ranks that come near the warning level (or are in an episode) need the machine.
        near = size > warn / 2
        cols = np.flatnonzero(near.any(axis=0) | carry_active)
        quiet_carry = table["quiet"][pos]
        # Ranks quiet on the last row were last unremarkable at the block's last step.
        table["quiet"][pos] = np.where(near[-1], quiet_carry, int(block.steps[-1]))
        if len(cols) == 0:
            return []
        p = pos[cols]
        s, ok = size[:, cols], judged[:, cols]
        active = hysteresis(s > warn, ~near[:, cols], carry_active[cols])
        runs = run_length(active, ok, table["run"][p])
        long = active & ok & (runs == self.escalate_steps)
        critical = hysteresis((s > crit) | long, ~active, table["critical"][p])
        quiet = last_step_where(~near[:, cols], block.steps, quiet_carry[cols])
        prev_active = np.vstack([carry_active[cols][None, :], active[:-1]])
        prev_crit = np.vstack([table["critical"][p][None, :], critical[:-1]])
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
            for sev, mask in (("warning", rising[i] & ~severe_at_entry[i]),
                              ("critical", severe_at_entry[i] | escalate[i])):
                if mask.any():
                    out.append(self._finding(step, metric, sev, ids[mask], means[i, cols][mask],
                                             s[i][mask], quiet[i][mask], warn, crit, signed,
                                             float(extra["centre"][i]), bool(long[i][mask].any())))
            if falling[i].any():
                out.append(Finding(kind=self.kind, step=step, metric=metric, severity="info",
                                   status="resolved", ranks=tuple(sorted(int(r) for r in ids[falling[i]])),
                                   evidence={"reason": "back with its peers"}))
        return out

    def _finding(self, step: int, metric: str, severity: str, ids: np.ndarray, mean: np.ndarray,
                 size: np.ndarray, quiet: np.ndarray, warn: float, crit: float, signed: bool,
                 centre: float, persistent: bool) -> Finding:
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
        return {m: t.state_dict() for m, t in self._tables.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for m, t in self._tables.items():
            if m in state:
                t.load_state_dict(state[m])


def _ewma(x: np.ndarray, observed: np.ndarray, alpha: float, m0: np.ndarray) -> np.ndarray:
    """Per-column weighted mean after each row, ``m = (1 - g) m + g x`` with ``g = alpha`` where
    observed and 0 elsewhere (a missing cell leaves the mean exactly as it was)."""
    gain = np.where(observed, alpha, 0.0)
    gx = gain * np.where(observed, x, 0.0)
    keep = 1.0 - gain
    out = np.empty(x.shape, dtype=np.float64)
    m = m0.astype(np.float64, copy=True)
    for i in range(x.shape[0]):   # sequential in steps, vectorised over ranks; in place is fastest
        m *= keep[i]
        m += gx[i]
        out[i] = m
    return out
