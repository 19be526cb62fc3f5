"""``divergence``: the loss slowly degrading against its own best, with an onset step.

Slow silent corruption (a bad rank poisoning every update a little, a subtly wrong learning-rate
schedule, a data pipeline that started repeating) shows as a training loss that stops improving
and creeps up, with no NaN and no single step odd enough to be a spike.

The signal is the per-step cross-rank median of ``metric`` in log space (on at most
``max_reference_ranks`` ranks chosen by id). It is smoothed by a robust exponentially weighted
mean ``s`` (gain ``alpha``; each step's pull clipped to ``clip`` noise sds, the noise sd being
estimated from successive differences, so a spike moves ``s`` by a hair while a lasting rise
moves it steadily). After ``warmup_steps`` observed steps the detector keeps the best (lowest)
``s`` seen and the step it was seen at. The statistic is the rise ``s - best`` (log units, ~
relative rise). It fires ``warning`` when the rise passes ``log1p(min_rise)`` and escalates to
``critical`` past ``log1p(critical_rise)``; it resolves when the rise falls below half the
warning level. ``onset_step`` is the step at which the smoothed loss was last at its best: the
last step the run was demonstrably healthy. (That is a one-sided CUSUM of the smoothed loss
against its running minimum; a plateau is not a divergence, a rise is.)

Ranks: a divergence is run-wide (``ranks=()``); the ``rank_outlier`` detector names a rank whose
own values disagree with its peers.

Score: ``(rise - warning level) / (critical level - warning level)`` clipped to [0, 1].

>>> from simulation import simulate_run, Divergence
>>> run = simulate_run(n_steps=3_000, n_ranks=32, seed=4, faults=[Divergence(step=2000, rate=3e-4)])
>>> [(f.step, f.severity, f.onset_step) for f in DivergenceDetector().update(run.block)]
[(2179, 'warning', 2062), (2568, 'critical', 2062)]
"""
from __future__ import annotations

import math
from typing import Any, Literal

from healthsvc_detectors.base import BlockDetector, Detector
from healthsvc_detectors.finding import Finding, Severity
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.stats.cross_section import ReferenceRanks, cross_section
from healthsvc_detectors.stats.scales import excess_score, log_positive

# E|y_t - y_{t-1}| = 2 sd / sqrt(pi) for independent normal noise.
_ABS_DIFF_TO_SD = math.sqrt(math.pi) / 2.0


class DivergenceDetector(Detector, BlockDetector):
    """Slow rise of the smoothed median loss above its best (see the module doc).

    Parameters
    ----------
    metric: the series watched (its cross-rank median per step).
    alpha: gain of the smoothed level (0.02 ~ a 50-step memory). Smaller: quieter, later.
    noise_alpha: gain of the noise-scale estimate (mean absolute successive difference).
    clip: a step pulls the level by at most ``clip`` noise sds (robustness to spikes).
    min_scale: floor of the noise sd, log units.
    warmup_steps: observed steps before the best level starts being tracked (skip the first,
        steep and bumpy part of training).
    min_rise: relative rise over the best smoothed loss that fires a warning (0.02 = 2 %).
    critical_rise: relative rise that escalates to critical.
    max_reference_ranks: ranks (chosen by id) used for the per-step median.
    """

    kind = "divergence"
    # Slow and lasting by nature; its onset (the last step at its best) is a guess that may fall
    # after the first corrupted update.
    kinds = (Kind("divergence", "The loss is degrading slowly against its own trend.",
                  resolves="latched", mutes=frozenset(), corruption="drift", heals=False,
                  onset_guessed=True, probe=False, incident=None, restarts_at="warning", blames_host=False, label="divergence",
                  colour="#1f77b4"),)

    def __init__(self, metric: str = "loss", alpha: float = 0.02, noise_alpha: float = 0.02,
                 clip: float = 3.0, min_scale: float = 0.002, warmup_steps: int = 250,
                 min_rise: float = 0.02, critical_rise: float = 0.1,
                 max_reference_ranks: int = 256) -> None:
        self.metric = metric
        self.alpha, self.noise_alpha, self.clip, self.min_scale = alpha, noise_alpha, clip, min_scale
        self.warmup_steps = warmup_steps
        self.min_rise, self.critical_rise = min_rise, critical_rise
        self.max_reference_ranks = max_reference_ranks
        super().__init__()

    def _reset(self) -> None:
        self._reference = ReferenceRanks(self.max_reference_ranks)
        self._n = 0                     # observed steps
        self._level = 0.0               # smoothed log value
        self._prev = 0.0                # previous observed log value
        self._abs_diff = 0.0            # EWMA of |successive difference|
        self._best: float | None = None
        self._best_step: int | None = None
        self._state: Literal["ok", "warning", "critical"] = "ok"
        self._onset: int | None = None

    # ------------------------------------------------------------------------------- update
    def update(self, block: StepBlock) -> list[Finding]:
        if block.n_steps == 0 or self.metric not in block.values:
            return []
        ref = self._reference(block.ranks)
        y, valid = log_positive(block.values[self.metric][:, ref], block.present[self.metric][:, ref])
        series = cross_section(y, valid, None, 1, with_scale=False)[0]
        warn, crit = math.log1p(self.min_rise), math.log1p(self.critical_rise)
        out: list[Finding] = []
        steps = block.steps.tolist()
        for i, v in enumerate(series.tolist()):   # scalar recursion over steps
            if v != v:
                continue
            if self._n == 0:
                self._level = self._prev = v
                self._n = 1
                continue
            self._abs_diff += max(self.noise_alpha, 1.0 / self._n) * (abs(v - self._prev) - self._abs_diff)
            self._prev = v
            sd = max(self._abs_diff * _ABS_DIFF_TO_SD, self.min_scale)
            r = min(max(v - self._level, -self.clip * sd), self.clip * sd)
            self._level += max(self.alpha, 1.0 / (self._n + 1)) * r
            self._n += 1
            if self._n <= self.warmup_steps:
                continue
            step = steps[i]
            if self._best is None or self._level < self._best:
                self._best, self._best_step = self._level, step
            rise = self._level - self._best
            if self._state == "ok" and rise > warn:
                self._state, self._onset = ("critical" if rise > crit else "warning"), self._best_step
                out.append(self._finding(step, self._state, rise, warn, crit))
            elif self._state == "warning" and rise > crit:
                self._state = "critical"
                out.append(self._finding(step, "critical", rise, warn, crit))
            elif self._state != "ok" and rise < warn / 2:
                out.append(Finding(kind=self.kind, step=step, severity="info", status="resolved",
                                   metric=self.metric, onset_step=self._onset,
                                   evidence={"reason": "back near its best", "rise": math.expm1(rise)}))
                self._state, self._onset = "ok", None
        return out

    def _finding(self, step: int, severity: Severity, rise: float, warn: float, crit: float) -> Finding:
        evidence = {
            "rise": math.expm1(rise),                  # relative, 0.03 = 3 % above the best
            "smoothed": math.exp(self._level),
            "best": math.exp(self._best) if self._best is not None else None,
            "best_step": self._best_step,
            "min_rise": self.min_rise, "critical_rise": self.critical_rise,
        }
        return Finding(kind=self.kind, step=step, ranks=(), severity=severity,
                       score=float(excess_score(rise, warn, crit)), metric=self.metric,
                       onset_step=self._onset, evidence=evidence)

    # -------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"n": self._n, "level": self._level, "prev": self._prev, "abs_diff": self._abs_diff,
                "best": self._best, "best_step": self._best_step, "state": self._state,
                "onset": self._onset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._n = int(state["n"])
        self._level, self._prev = float(state["level"]), float(state["prev"])
        self._abs_diff = float(state["abs_diff"])
        self._best = None if state["best"] is None else float(state["best"])
        self._best_step = None if state["best_step"] is None else int(state["best_step"])
        self._state = state["state"]
        self._onset = None if state["onset"] is None else int(state["onset"])
