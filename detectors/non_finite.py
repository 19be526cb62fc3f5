"""``non_finite``: the first NaN / +Inf / -Inf per metric and rank, at its exact step.

A NaN usually starts on one rank (an overflow in its forward or backward pass), shows in that
rank's *local* values (``loss``, ``local_grad_norm``), and is spread to every rank by the
all-reduce: the global ``grad_norm`` is NaN everywhere at the same step, and the next step's loss is
NaN everywhere because the weights are poisoned. So the detector remembers the **origin**: the
ranks whose local values went non-finite first (at the earliest such step of the run). It blames:

- a local metric that goes non-finite on some ranks first: those ranks (``evidence.role =
  "origin"``);
- a global metric (``grad_norm``) that goes non-finite on many ranks at once (at least
  ``global_fraction`` of the reporting ranks): the origin ranks when their local values went
  non-finite at or before that step (``role = "spread"``), else nobody (``ranks=()``,
  ``role = "unknown_origin"``: the local metrics were finite or not reported);
- a local metric that goes non-finite on further ranks after an origin is known: the origin
  ranks (``role = "spread"``), with the newly affected ranks counted in the evidence;
- anything else (a metric with no training-value meaning such as ``step_time``, or a global
  metric non-finite on a few ranks only): the ranks where it happened (``role = "local"``).

Each (metric, rank) fires once. Severity is always ``critical`` and ``score`` is 1.0 (a
non-finite value is as bad as this detector can say). Missing cells (``present=False``) are never
non-finite values. No warm-up, no state beyond what fired.

>>> from simulation import simulate_run, NonFinite
>>> run = simulate_run(n_steps=300, n_ranks=16, seed=1, faults=[NonFinite(step=200, rank=5)])
>>> [(f.metric, f.step, f.ranks, f.evidence["role"]) for f in NonFiniteDetector().update(run.block)]
[('local_grad_norm', 200, (5,), 'origin'), ('grad_norm', 200, (5,), 'spread'), ('loss', 201, (5,), 'spread'), ('local_grad_norm', 201, (5,), 'spread')]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from healthsvc_detectors.base import BlockDetector, Detector
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.frame import StepBlock

_MAX_LISTED = 32  # affected rank ids listed in evidence; beyond that only the count


class NonFiniteDetector(Detector, BlockDetector):
    """First non-finite value per metric and rank; names the origin ranks of a NaN.

    Parameters
    ----------
    metrics: metrics to watch; ``None`` watches every metric a block carries.
    local_metrics: per-rank training values whose first non-finite ranks are the origin.
    global_metrics: values that should be identical on all ranks (after the all-reduce).
    global_fraction: share of reporting ranks at which a global metric counts as non-finite
        "everywhere" (and is blamed on the origin rather than on the ranks that show it).
    """

    kind = "non_finite"
    kinds = (Kind("non_finite", "A metric was NaN or infinite: the weights are likely corrupted from this step on.",
                  resolves="latched", mutes=frozenset({"loss_spike", "grad_spike", "divergence"}),
                  corruption="abrupt", heals=True, onset_guessed=False, probe=False,
                  incident="non_finite", restarts_at="warning", blames_host=False, label="NaN / Inf", colour="#d62728"),)

    def __init__(self, metrics: tuple[str, ...] | None = None,
                 local_metrics: tuple[str, ...] = ("loss", "local_grad_norm"),
                 global_metrics: tuple[str, ...] = ("grad_norm",),
                 global_fraction: float = 0.5) -> None:
        self.metrics = None if metrics is None else tuple(metrics)
        self.local_metrics = tuple(local_metrics)
        self.global_metrics = tuple(global_metrics)
        self.global_fraction = global_fraction
        super().__init__()

    def _reset(self) -> None:
        self._fired: dict[str, set[int]] = {}     # metric -> rank ids already reported
        self._origin: tuple[int, ...] = ()
        self._origin_step: int | None = None
        self._origin_metric: str | None = None

    # ------------------------------------------------------------------------------- update
    def update(self, block: StepBlock) -> list[Finding]:
        names = [m for m in (self.metrics or block.values) if m in block.values]
        new: dict[str, np.ndarray] = {}
        for m in names:
            v, present = block.values[m], block.present[m]
            if present.all():
                # Fast path (the usual case): one pass, nothing non-finite, nothing to mask.
                if np.isfinite(v).all():
                    continue
            bad = ~np.isfinite(v)
            bad &= present
            if bad.any():
                new[m] = bad
        if not new:
            return []
        # Drop (metric, rank) pairs that fired before, and keep only the first row per rank.
        for m, bad in list(new.items()):
            seen = self._fired.get(m)
            if seen:
                bad[:, np.isin(block.ranks, list(seen))] = False
            first = bad.argmax(axis=0)
            keep = np.zeros_like(bad)
            cols = np.flatnonzero(bad.any(axis=0))
            keep[first[cols], cols] = True
            if keep.any():
                new[m] = keep
            else:
                del new[m]
        rows = sorted({int(i) for bad in new.values() for i in np.flatnonzero(bad.any(axis=1))})
        findings: list[Finding] = []
        for i in rows:
            findings.extend(self._judge_row(block, i, {m: bad[i] for m, bad in new.items()}))
        return findings

    def _judge_row(self, block: StepBlock, i: int, bad: dict[str, np.ndarray]) -> list[Finding]:
        step = int(block.steps[i])
        hit = {m: block.ranks[b] for m, b in bad.items() if b.any()}
        # Local values first: the earliest step with non-finite local values names the origin.
        if self._origin_step is None:
            local = [m for m in self.local_metrics if m in hit]
            if local:
                origin = np.unique(np.concatenate([hit[m] for m in local]))
                self._origin = tuple(int(r) for r in origin)
                self._origin_step, self._origin_metric = step, local[0]
        out = []
        ordered = [m for m in self.local_metrics if m in hit] + \
                  [m for m in hit if m not in self.local_metrics]
        for m in ordered:
            ranks = tuple(sorted(int(r) for r in hit[m]))
            self._fired.setdefault(m, set()).update(ranks)
            reporting = int(block.present[m][i].sum())
            values = block.values[m][i][bad[m]]
            out.append(self._finding(m, step, ranks, reporting, values))
        return out

    def _finding(self, metric: str, step: int, affected: tuple[int, ...], reporting: int,
                 values: np.ndarray) -> Finding:
        kinds = sorted({"nan" if np.isnan(v) else ("inf" if v > 0 else "-inf") for v in values})
        origin_known = self._origin_step is not None and self._origin_step <= step
        is_origin = origin_known and self._origin_step == step and set(affected) <= set(self._origin)
        widespread = len(affected) >= self.global_fraction * max(reporting, 1)
        if metric in self.local_metrics and (is_origin or not origin_known):
            role, ranks = "origin", affected
        elif origin_known and (metric in self.global_metrics and widespread
                               or metric in self.local_metrics):
            role, ranks = "spread", self._origin
        elif metric in self.global_metrics and widespread:
            role, ranks = "unknown_origin", ()
        else:
            role, ranks = "local", affected
        evidence: dict[str, Any] = {
            "role": role,
            "values": kinds,
            "affected_count": len(affected),
            "affected_ranks": list(affected[:_MAX_LISTED]),
            "reporting_ranks": reporting,
            "origin_ranks": list(self._origin[:_MAX_LISTED]),
            "origin_step": self._origin_step,
            "origin_metric": self._origin_metric,
        }
        return Finding(kind=self.kind, step=step, ranks=ranks, severity="critical", score=1.0,
                       metric=metric, onset_step=self._origin_step if role == "spread" else step,
                       evidence=evidence)

    # -------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "fired": {m: sorted(r) for m, r in self._fired.items()},
            "origin": list(self._origin),
            "origin_step": self._origin_step,
            "origin_metric": self._origin_metric,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._fired = {m: {int(r) for r in rs} for m, rs in state["fired"].items()}
        self._origin = tuple(int(r) for r in state["origin"])
        self._origin_step = None if state["origin_step"] is None else int(state["origin_step"])
        self._origin_metric = state["origin_metric"]
