"""Checkpoint interval advice from what a run has observed.

Inputs the service already has: the checkpoint writes (their durations give ``C``), the
failures (restarts, stalls, non-finite and corruption incidents give ``M``), the restarts'
downtimes (``R``) and the typical step time (turns checkpoint steps into seconds).

**MTBF with too few failures (Gamma–Poisson shrinkage).** A run that has seen no failure has
not shown an infinite MTBF. The failure rate λ gets a Gamma(α, β) prior whose mean is the prior
MTBF ``M0`` (an organisation-wide figure when the service has one): α = ``pseudo_failures``,
β = α·M0 seconds of pseudo exposure. After ``n`` failures in ``T`` seconds of run time the
posterior mean rate is (α + n)/(α·M0 + T), so

    M̂ = (α·M0 + T) / (α + n)

With no failures M̂ starts at M0 and grows with T; with many it tends to the observed T/n.
``prior_weight = α/(α + n)`` says how much of the estimate is still the prior.

**Failures are counted once.** A stall that leads to a restart is one failure, not two:
incidents closer than ``merge_window_s`` to the previous counted one are merged.

Example:
    >>> advice = advise_interval(
    ...     checkpoints=[CheckpointWrite(step=s, uri=f"ckpt/{s}", written_at_s=float(s),
    ...                                  duration_s=60.0) for s in (1000, 2000, 3000)],
    ...     failures=[], exposure_s=3 * 3600.0, step_time_s=1.0,
    ...     prior=MtbfPrior(mtbf_s=4 * 3600.0, pseudo_failures=1.0))
    >>> advice.mtbf.source, round(advice.mtbf.mtbf_s), round(advice.daly_interval_s)
    ('prior', 25200, 1699)
    >>> advice.current_interval_s, advice.warning is None
    (1000.0, True)
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from healthsvc_detectors.offline.economics.intervals import (daly_interval_s, expected_overhead_fraction,
                                                   young_interval_s)
from healthsvc_detectors.offline.economics.records import FAILURE_KINDS, CheckpointWrite, Incident

# Defaults, documented in docs/economics.md.
DEFAULT_PRIOR_MTBF_S = 8 * 3600.0   # a large job without a fleet figure: failures every few hours
DEFAULT_PSEUDO_FAILURES = 2.0       # the prior weighs as much as two observed failures
DEFAULT_MERGE_WINDOW_S = 600.0      # a stall and the restart it causes are one failure
DEFAULT_WARN_RATIO = 2.0            # warn when current/optimum is above 2 or below 1/2
OBSERVED_PRIOR_WEIGHT = 0.2         # below this prior share the estimate is called "observed"

MtbfSource = Literal["prior", "blended", "observed"]


@dataclass(frozen=True)
class MtbfPrior:
    """Prior belief about the MTBF: ``mtbf_s`` weighted as ``pseudo_failures`` failures.

    ``source`` says where the figure comes from (``"default"`` or ``"organisation"``).
    """

    mtbf_s: float = DEFAULT_PRIOR_MTBF_S
    pseudo_failures: float = DEFAULT_PSEUDO_FAILURES
    source: str = "default"

    def __post_init__(self) -> None:
        if not (self.mtbf_s > 0 and math.isfinite(self.mtbf_s)):
            raise ValueError(f"prior mtbf_s must be positive seconds, got {self.mtbf_s!r}")
        if not self.pseudo_failures > 0:
            raise ValueError(f"pseudo_failures must be > 0, got {self.pseudo_failures!r}")

    @classmethod
    def from_fleet(cls, failures: int, exposure_s: float,
                   pseudo_failures: float = DEFAULT_PSEUDO_FAILURES) -> "MtbfPrior":
        """An organisation-wide prior: pooled run time over pooled failures of other runs.

        Falls back to the default prior when the fleet has seen no failure yet.
        """
        if failures <= 0 or exposure_s <= 0:
            return cls(pseudo_failures=pseudo_failures)
        return cls(mtbf_s=exposure_s / failures, pseudo_failures=pseudo_failures,
                   source="organisation")

    def to_dict(self) -> dict[str, Any]:
        return {"mtbf_s": self.mtbf_s, "pseudo_failures": self.pseudo_failures,
                "source": self.source}


@dataclass(frozen=True)
class MtbfEstimate:
    """The MTBF used for the advice, with how it was obtained."""

    mtbf_s: float
    source: MtbfSource
    failures: int
    exposure_s: float
    observed_mtbf_s: float | None   # T/n, None before the first failure
    prior_weight: float             # α/(α+n), in (0, 1]
    prior: MtbfPrior

    def to_dict(self) -> dict[str, Any]:
        return {"mtbf_s": self.mtbf_s, "source": self.source, "failures": self.failures,
                "exposure_s": self.exposure_s, "observed_mtbf_s": self.observed_mtbf_s,
                "prior_weight": self.prior_weight, "prior": self.prior.to_dict()}


def count_failures(incidents: Sequence[Incident], merge_window_s: float = DEFAULT_MERGE_WINDOW_S) -> int:
    """Failures among ``incidents``: kinds in ``FAILURE_KINDS``, merged within ``merge_window_s``.

    >>> count_failures([Incident("stall", 0.0), Incident("restart", 120.0),
    ...                 Incident("non_finite", 7200.0), Incident("loss_spike", 9000.0)])
    2
    """
    times = sorted(i.at_s for i in incidents if i.kind in FAILURE_KINDS)
    count, last_counted = 0, -math.inf
    for t in times:
        if t - last_counted > merge_window_s:
            count += 1
            last_counted = t
    return count


def estimate_mtbf(failures: int, exposure_s: float, prior: MtbfPrior = MtbfPrior()) -> MtbfEstimate:
    """Posterior-mean MTBF (α·M0 + T)/(α + n), see the module docstring.

    >>> estimate_mtbf(failures=0, exposure_s=0.0, prior=MtbfPrior(14400.0, 2.0)).mtbf_s
    14400.0
    >>> estimate_mtbf(failures=10, exposure_s=36000.0, prior=MtbfPrior(14400.0, 2.0)).mtbf_s
    5400.0
    """
    if failures < 0 or exposure_s < 0:
        raise ValueError("failures and exposure_s must be >= 0")
    alpha = prior.pseudo_failures
    mtbf_s = (alpha * prior.mtbf_s + exposure_s) / (alpha + failures)
    prior_weight = alpha / (alpha + failures)
    if failures == 0:
        source: MtbfSource = "prior"
    elif prior_weight <= OBSERVED_PRIOR_WEIGHT:
        source = "observed"
    else:
        source = "blended"
    observed = exposure_s / failures if failures else None
    return MtbfEstimate(mtbf_s=mtbf_s, source=source, failures=failures, exposure_s=exposure_s,
                        observed_mtbf_s=observed, prior_weight=prior_weight, prior=prior)


def checkpoint_cost_s(checkpoints: Sequence[CheckpointWrite]) -> float | None:
    """Observed C: the mean write duration (Young and Daly want the expected cost), None if unknown."""
    durations = [c.duration_s for c in checkpoints if c.duration_s is not None and c.duration_s >= 0]
    return statistics.fmean(durations) if durations else None


def current_interval_steps(checkpoints: Sequence[CheckpointWrite]) -> float | None:
    """The run's checkpoint spacing in steps: median gap between consecutive writes.

    Gaps that are not positive (a resume from an older checkpoint repeats steps) are skipped.
    """
    steps = [c.step for c in sorted(checkpoints, key=lambda c: (c.written_at_s, c.step))]
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    return float(statistics.median(gaps)) if gaps else None


RestartCostSource = Literal["observed", "assumed_equal_to_checkpoint_cost", "none"]


@dataclass(frozen=True)
class IntervalAdvice:
    """Checkpoint interval advice. Intervals are compute seconds between checkpoints;
    overheads are fractions of wall time in [0, 1) under Daly's model (see ``intervals``)."""

    checkpoint_cost_s: float | None
    checkpoints_observed: int
    restart_cost_s: float
    restart_cost_source: RestartCostSource
    mtbf: MtbfEstimate
    young_interval_s: float | None
    daly_interval_s: float | None
    step_time_s: float | None
    current_interval_steps: float | None
    current_interval_s: float | None
    recommended_interval_steps: int | None
    overhead_at_young: float | None
    overhead_at_daly: float | None
    overhead_at_current: float | None
    current_to_optimum_ratio: float | None
    warning: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_cost_s": self.checkpoint_cost_s,
            "checkpoints_observed": self.checkpoints_observed,
            "restart_cost_s": self.restart_cost_s,
            "restart_cost_source": self.restart_cost_source,
            "mtbf": self.mtbf.to_dict(),
            "young_interval_s": self.young_interval_s,
            "daly_interval_s": self.daly_interval_s,
            "step_time_s": self.step_time_s,
            "current_interval_steps": self.current_interval_steps,
            "current_interval_s": self.current_interval_s,
            "recommended_interval_steps": self.recommended_interval_steps,
            "overhead": {"young": self.overhead_at_young, "daly": self.overhead_at_daly,
                         "current": self.overhead_at_current},
            "current_to_optimum_ratio": self.current_to_optimum_ratio,
            "warning": self.warning,
        }


def advise_interval(*, checkpoints: Sequence[CheckpointWrite], failures: Sequence[Incident],
                    exposure_s: float, step_time_s: float | None,
                    restart_costs_s: Sequence[float] = (), prior: MtbfPrior = MtbfPrior(),
                    merge_window_s: float = DEFAULT_MERGE_WINDOW_S,
                    warn_ratio: float = DEFAULT_WARN_RATIO) -> IntervalAdvice:
    """Young and Daly optimum intervals for this run, its current interval, and a warning when
    the current interval is more than ``warn_ratio`` times away from Daly's optimum.

    ``exposure_s``: run time over which ``failures`` were observed (seconds of attempts).
    ``restart_costs_s``: observed restart downtimes; when there are none, R is assumed equal to
    C (a restart reads back what a checkpoint wrote).
    """
    cost_s = checkpoint_cost_s(checkpoints)
    mtbf = estimate_mtbf(count_failures(failures, merge_window_s), max(0.0, exposure_s), prior)
    restarts = [r for r in restart_costs_s if r >= 0]
    restart_source: RestartCostSource
    if restarts:
        restart_s, restart_source = statistics.fmean(restarts), "observed"
    elif cost_s is not None:
        restart_s, restart_source = cost_s, "assumed_equal_to_checkpoint_cost"
    else:
        restart_s, restart_source = 0.0, "none"

    gap_steps = current_interval_steps(checkpoints)
    current_s = gap_steps * step_time_s if gap_steps is not None and step_time_s else None

    young = daly = over_young = over_daly = over_current = ratio = None
    recommended_steps = None
    warning = None
    if cost_s is not None and cost_s > 0:
        young = young_interval_s(cost_s, mtbf.mtbf_s)
        daly = daly_interval_s(cost_s, mtbf.mtbf_s)
        over_young = expected_overhead_fraction(young, cost_s, restart_s, mtbf.mtbf_s)
        over_daly = expected_overhead_fraction(daly, cost_s, restart_s, mtbf.mtbf_s)
        if step_time_s:
            recommended_steps = max(1, round(daly / step_time_s))
        if current_s is not None and current_s > 0:
            over_current = expected_overhead_fraction(current_s, cost_s, restart_s, mtbf.mtbf_s)
            ratio = current_s / daly
            if ratio > warn_ratio or ratio < 1.0 / warn_ratio:
                direction = "more" if ratio > 1 else "less"
                warning = (
                    f"checkpoint interval {current_s:.0f} s is {ratio:.2f}x the optimum "
                    f"{daly:.0f} s (C={cost_s:.0f} s, M={mtbf.mtbf_s:.0f} s, {mtbf.source}); "
                    f"checkpoint {direction} often: every ~{recommended_steps} steps; expected "
                    f"overhead {over_current:.1%} now vs {over_daly:.1%} at the optimum")
    return IntervalAdvice(
        checkpoint_cost_s=cost_s,
        checkpoints_observed=sum(1 for c in checkpoints if c.duration_s is not None),
        restart_cost_s=restart_s, restart_cost_source=restart_source, mtbf=mtbf,
        young_interval_s=young, daly_interval_s=daly, step_time_s=step_time_s,
        current_interval_steps=gap_steps, current_interval_s=current_s,
        recommended_interval_steps=recommended_steps,
        overhead_at_young=over_young, overhead_at_daly=over_daly, overhead_at_current=over_current,
        current_to_optimum_ratio=ratio, warning=warning)
