"""The per-rank view of a spike: each rank against the cross-rank centre, judged by its own history.

A rank more than ``rank_z_threshold`` of its own sds and ``rank_min_rise`` above where it usually
sits among its peers (:class:`~healthsvc_detectors.peers.PeerDeviation`) enters an episode, with the same
severity policy as the job-wide view; an episode that began at a job-wide spike is left to that
view, which names these ranks.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from healthsvc_detectors.finding import Finding, Severity
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.peers import PAIR_NOTE
from healthsvc_detectors.stats.machines import hysteresis, run_length
from healthsvc_detectors.stats.rank_table import RankTable
from healthsvc_detectors.stats.scales import excess_score

if TYPE_CHECKING:
    from healthsvc_detectors.spike.detector import SpikeDetector


class RankJudging:
    """The per-rank view of :class:`~healthsvc_detectors.spike.detector.SpikeDetector`: its episodes (the
    rank table ``_ranks``) and its findings."""

    # Declared for the type checker; the detector sets them.
    kind: str
    rank_metric: str | None
    rank_z_threshold: float
    rank_min_rise: float
    rank_exit_z: float
    large_ratio: float | None
    confirm_steps: int
    escalate_steps: int
    leading_signal: bool
    _ranks: RankTable

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
        # Of two ranks, one rising over the other is the other falling: the findings name both.
        pair = tuple(sorted(int(r) for r in block.ranks)) if block.n_ranks == 2 else None
        for i in np.flatnonzero((rising | falling | confirm | escalating).any(axis=1)):
            step = int(block.steps[i])
            if rising[i].any() and not at_spike[i]:
                entries: tuple[tuple[Severity, np.ndarray], ...] = (
                    ("warning", rising[i] & large[i]), ("info", rising[i] & ~large[i]))
                for sev, mask in entries:
                    if mask.any():
                        out.append(self._rank_finding(ranks, mask, z[i], rise[i], sev, step,
                                                      "large" if sev == "warning" else "transient",
                                                      pair=pair))
            if confirm[i].any():
                out.append(self._rank_finding(ranks, confirm[i], z[i], rise[i], "warning",
                                              step - self.confirm_steps, "lasting", at=step,
                                              pair=pair))
            if escalating[i].any():
                out.append(self._rank_finding(ranks, escalating[i], z[i], rise[i], "critical",
                                              step - self.escalate_steps, "not recovering", at=step,
                                              pair=pair))
            if falling[i].any():
                gone = pair or tuple(sorted(int(r) for r in ranks[falling[i]]))
                out.append(Finding(kind=self.kind, step=step, ranks=gone, severity="info",
                                   score=0.0, metric=self.rank_metric, status="resolved",
                                   evidence={"scope": "ranks", "reason": "recovered"}))
        return out

    def _rank_finding(self, ids: np.ndarray, cols: np.ndarray, row_z: np.ndarray,
                      row_rise: np.ndarray, severity: Severity, onset: int, reason: str,
                      at: int | None = None, pair: tuple[int, ...] | None = None) -> Finding:
        ranks = pair or tuple(sorted(int(r) for r in ids[cols]))
        z = float(np.max(row_z[cols]))
        evidence: dict[str, Any] = {
            "scope": "ranks", "rank_z": z, "ratio_to_usual": math.exp(float(np.max(row_rise[cols]))),
            "rank_z_threshold": self.rank_z_threshold, "count": len(ranks), "reason": reason,
        }
        if severity == "critical":
            evidence.update(escalated=True, steps_without_recovery=self.escalate_steps)
        if self.leading_signal:
            evidence["leading_signal"] = True
        if pair:
            evidence.update(pair=True, rose=[int(r) for r in ids[cols]], note=PAIR_NOTE)
        return Finding(kind=self.kind, step=onset if at is None else at, ranks=ranks, severity=severity,
                       score=float(excess_score(z, self.rank_z_threshold, 2 * self.rank_z_threshold)),
                       metric=self.rank_metric, onset_step=onset, evidence=evidence)


class _RankView:
    """Per row: the cross-rank centre of ``rank_metric`` (log), and each rank's deviation from it
    judged by its own history (``z`` in its own sds, ``rise`` beyond its usual offset); rows with
    fewer than ``min_ranks`` usable ranks are not judged per rank."""

    def __init__(self, det: SpikeDetector, block: StepBlock, ref: np.ndarray) -> None:
        metric = det.rank_metric
        assert metric is not None   # built only for a detector with a rank metric
        v = det._peers.view(block, metric, ref)
        self.centre = v.centre
        self.z, self.rise, self.z_row_max = v.z, v.rise, v.z_row_max
        # (Each rank's centre leaves it out: of two ranks, a rank's rise is over its one peer.)
        few = v.count < det.min_ranks
        if few.any():
            self.z, self.rise = self.z.copy(), self.rise.copy()
            self.z[few], self.rise[few] = np.nan, np.nan
