"""A scalar baseline: level + trend of a series in log space (Holt's linear smoothing) with a
robust scale and warm-up. Its level learns only values a detector judged normal, its scale also
the others, clipped (:meth:`RobustTrend.learn_scale`)."""
from __future__ import annotations

import math
from typing import Any

# E|X| / sd for a normal distribution.
MEAN_ABS_TO_SD = math.sqrt(math.pi / 2.0)


class RobustTrend:
    """Level + trend of a scalar series in log space, with a robust scale and warm-up.

    One-step prediction ``pred = level + trend``; residual ``r = y - pred``; scale ``s`` is the
    EWMA of ``|r|`` turned into a standard deviation (x sqrt(pi/2)), floored at ``min_scale``.
    :meth:`zscore` scores a value without learning it; :meth:`learn` updates the state (the caller
    learns only values it judged normal, so a spike does not drag the baseline up). During the
    first ``warmup_steps`` learned values the gains start at 1/n so the baseline settles fast;
    afterwards residuals are clipped to ``clip`` scales (Huber) so a single odd value moves the
    level little.

    Parameters: ``alpha`` level gain, ``beta`` trend gain (relative to alpha), ``scale_alpha``
    gain of the scale, ``min_scale`` floor in log units (0.005 ~ 0.5 %).

    >>> b = RobustTrend(warmup_steps=10)
    >>> for i in range(300):          # log loss falling 0.002 per step
    ...     b.learn(1.0 - 0.002 * i)
    >>> round(b.predict(), 3), round(b.trend, 4)   # next value is 0.4
    (0.4, -0.002)
    >>> round(b.zscore(0.4 + 0.05), 1)  # 5 % above the prediction, in (floored) robust sds
    10.0
    """

    def __init__(self, alpha: float = 0.1, beta: float = 0.1, scale_alpha: float = 0.05,
                 warmup_steps: int = 50, min_scale: float = 0.005, clip: float = 4.0) -> None:
        self.alpha, self.beta, self.scale_alpha = alpha, beta, scale_alpha
        self.warmup_steps, self.min_scale, self.clip = warmup_steps, min_scale, clip
        self.n = 0
        self.level = 0.0
        self.trend = 0.0
        self.mean_abs = 0.0

    @property
    def warm(self) -> bool:
        return self.n >= self.warmup_steps

    def predict(self) -> float:
        return self.level + self.trend

    def sd(self) -> float:
        return max(self.mean_abs * MEAN_ABS_TO_SD, self.min_scale)

    def zscore(self, y: float) -> float:
        """Residual of ``y`` against the prediction in robust standard deviations."""
        if self.n == 0:
            return 0.0
        return (y - self.predict()) / self.sd()

    def learn(self, y: float) -> None:
        if self.n == 0:
            self.level, self.trend, self.mean_abs, self.n = y, 0.0, 0.0, 1
            return
        pred = self.level + self.trend
        r = y - pred
        if self.n >= self.warmup_steps:
            lim = self.clip * self.sd()
            r = min(max(r, -lim), lim)
            a, sa = self.alpha, self.scale_alpha
        else:
            a = max(self.alpha, 1.0 / (self.n + 1))
            sa = max(self.scale_alpha, 1.0 / self.n)
        self.level = pred + a * r
        self.trend = self.trend + a * self.beta * r
        self.mean_abs += sa * (abs(r) - self.mean_abs)
        self.n += 1

    def learn_scale(self, y: float) -> None:
        """Learn only the scale from ``y`` (clipped), leaving level and trend alone: a value judged
        anomalous still says how noisy the series is, so the scale cannot shrink to its floor by
        learning only the values below the threshold."""
        if self.n < 2:
            return
        r = y - (self.level + self.trend)
        lim = self.clip * self.sd()
        self.mean_abs += self.scale_alpha * (min(abs(r), lim) - self.mean_abs)

    def restart(self, y: float) -> None:
        """Re-anchor the level at ``y`` (after a lasting shift), keeping the learned scale."""
        self.level, self.trend = y, 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "level": self.level, "trend": self.trend, "mean_abs": self.mean_abs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])
        self.level, self.trend = float(state["level"]), float(state["trend"])
        self.mean_abs = float(state["mean_abs"])
