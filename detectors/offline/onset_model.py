"""The data model of the onset estimate: its hyper-parameters and its answers.

Kept apart from the estimate (:mod:`healthsvc_detectors.offline.onset`) and the change point machinery
(:mod:`healthsvc_detectors.offline.changepoint`) so that both import it and neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Shape = Literal["abrupt", "gradual"]
Origin = Literal["data", "hardware", "unknown"]
ONSET_SIGNALS: tuple[str, ...] = (
    "non_finite", "loss_trend", "grad_norm", "rank_disagreement", "findings")
# Per-rank metrics compared across ranks, in order of preference.
RANK_METRICS: tuple[str, ...] = ("local_grad_norm", "loss")


@dataclass(frozen=True)
class OnsetParams:
    """Hyper-parameters of the onset estimate (defaults tuned on the seeded evaluation).

    ``min_window``: samples in the first, most local analysis window.
    ``max_points``: longer windows are averaged into this many bins.
    ``significance``: LR needed above ``2 ln n`` for a change to count (unitless, chi^2 scale).
    ``interval_lr``: LR drop from the best change point that still belongs to the interval.
    ``min_excess_sigma``: the fitted change at the last sample, in noise standard deviations.
    ``min_pre_ratio``: samples before the change per sample after it before the window is
    trusted (the earlier trend must be estimated from enough history).
    ``rank_score_min``: a rank's deviation from its peers (t-statistic) to be a suspect.
    ``rank_min_excess_sigma``: ``min_excess_sigma`` for a suspect rank's deviation from its
    peers. Smaller: the suspect already stands out by ``rank_score_min`` over many steps, so its
    change point need only be significant and located, and a corrupted rank's disagreement often
    steps up by about one per-step noise sd for good (gradient noise on a quarter of one rank's
    elements: its local norm 1.115x its peers' against a per-step log sd of 0.07).
    ``located_significance``: the ``significance`` used when a finding vouches for a change the
    history alone does not show; the default accepts the likeliest change point whatever its LR.
    ``rank_history_steps``: how many recent steps the per-rank comparison looks at (its cost is
    steps x ranks; the aggregate series always use the whole history).
    """

    min_window: int = 512
    max_points: int = 8192
    significance: float = 16.0
    interval_lr: float = 12.0
    min_excess_sigma: float = 1.5
    min_pre_ratio: float = 0.5
    rank_score_min: float = 8.0
    rank_min_excess_sigma: float = 0.75
    located_significance: float = -1e9
    rank_history_steps: int = 262_144


@dataclass(frozen=True)
class SignalEstimate:
    """One signal's view of the first corrupted update (steps are update steps, see module doc).

    ``score`` in [0, 1): 0 at the significance threshold, towards 1 as the evidence grows.
    """

    signal: str
    step: int
    low: int
    high: int
    shape: Shape
    score: float
    ranks: tuple[int, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"signal": self.signal, "step": self.step, "low": self.low, "high": self.high,
                "shape": self.shape, "score": round(self.score, 4), "ranks": list(self.ranks),
                "detail": self.detail}


@dataclass(frozen=True)
class OnsetEstimate:
    """The first corrupted update: ``step`` within ``[low, high]`` (inclusive update steps).

    ``confidence`` in [0, 1] is a heuristic, not a calibrated probability: the strongest signal's
    score times the share of signals that agree with ``step``. ``origin`` says whether the evidence
    points at the data (a change on every rank at once) or at hardware (one rank, ``ranks``);
    ``spike_end`` is the last step of the abrupt excursion that began at ``step`` (data to skip).
    """

    step: int
    low: int
    high: int
    confidence: float
    signals_used: list[str]
    per_signal: dict[str, SignalEstimate]
    shape: Shape = "abrupt"
    origin: Origin = "unknown"
    ranks: tuple[int, ...] = ()
    spike_end: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "low": self.low, "high": self.high,
            "confidence": round(self.confidence, 4), "signals_used": list(self.signals_used),
            "shape": self.shape, "origin": self.origin, "ranks": list(self.ranks),
            "spike_end": self.spike_end,
            "per_signal": {k: v.to_dict() for k, v in self.per_signal.items()},
        }

