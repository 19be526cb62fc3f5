"""One rank's straggler episode, replayed step by step: firing, paging once it lasted, resolving.

The block-vectorised recursions of :mod:`healthsvc_detectors.straggler.detector` advance every rank; the
few ranks with something to decide (firing, or past the threshold within the block) are replayed
here one by one from their start values with the same float32 arithmetic, and this is where the
findings and their evidence are made.
"""
from __future__ import annotations

import numpy as np

from healthsvc_detectors.finding import Finding, Severity
from healthsvc_detectors.straggler.reference import SOURCES


class StragglerReplay:
    """The per-rank state machine and findings of
    :class:`~healthsvc_detectors.straggler.detector.StragglerDetector` (its thresholds and ``kind``)."""

    # Declared for the type checker; the detector sets them.
    kind: str
    min_ratio: float
    critical_ratio: float
    cusum_k: float
    cusum_h: float
    level_alpha: float
    resolve_alpha: float
    resolve_ratio: float
    resolve_steps: int
    min_duration_s: float
    onset_k: float
    min_onset_steps: int
    min_measure_steps: int

    def _replay(self, col: "_Column", rank: int, steps: np.ndarray, y: np.ndarray,
                gain: np.ndarray, ok: np.ndarray, v: np.ndarray, med: np.ndarray,
                scale: np.ndarray, src: np.ndarray | None, ts: np.ndarray) -> list[Finding]:
        """The per-rank state machine over one block column: the same float32 arithmetic as the
        fast path (``col``'s recursion values are numpy float32 scalars, ``y`` and ``gain``
        float32, and Python floats combine with them as float32)."""
        out: list[Finding] = []
        a = self.level_alpha
        dk = self.onset_k - self.cusum_k
        for i in range(len(steps)):
            step = int(steps[i])
            col.cusum = max(col.cusum + y[i], 0.0)
            col.mcusum = max(col.mcusum + (y[i] - dk if ok[i] else 0.0), 0.0)
            if not ok[i]:
                if col.mcusum == 0.0:
                    col.mlevel, col.mcount = 0.0, 0.0
                if col.cusum == 0.0:
                    col.level, col.count = 0.0, 0.0
                continue
            col.mlevel = col.mlevel * (1.0 - a) + gain[i]
            col.mcount += 1.0
            if col.mcusum == 0.0:
                col.mlevel, col.mcount = 0.0, 0.0
            col.level = col.level * (1.0 - a) + gain[i]
            col.count += 1.0
            if col.cusum == 0.0:
                col.level, col.count = 0.0, 0.0
            ratio = float(v[i] / med[i])
            t = float(ts[i])
            if col.firing:
                col.recent += self.resolve_alpha * (ratio - col.recent)
                if (not col.paged and t == t and col.fire_ts >= 0
                        and t - col.fire_ts >= self.min_duration_s and col.recent >= self.min_ratio):
                    col.paged = True
                    since = step - col.onset + 1 if col.onset is not None else int(col.count)
                    out.append(self._finding(step, rank, col, col.recent, since, v[i], med[i],
                                             self._severity(col.recent), t))
                col.below = col.below + 1 if col.recent < self.resolve_ratio else 0
                if col.below >= self.resolve_steps:
                    out.append(Finding(
                        kind=self.kind, step=step, ranks=(rank,), severity="info", score=0.0,
                        metric=SOURCES[col.source], status="resolved",
                        evidence={"recent_ratio": round(col.recent, 4),
                                  "resolve_ratio": self.resolve_ratio, "below_steps": col.below}))
                    col.firing, col.below = False, 0
                    col.cusum, col.mcusum, col.level, col.count = 0.0, 0.0, 0.0, 0.0
                    col.mlevel, col.mcount, col.onset = 0.0, 0.0, None
                continue
            if col.cusum < self.cusum_h:
                continue
            magnitude = float(col.level) / (1.0 - (1.0 - a) ** float(col.count))
            if magnitude < self.min_ratio:
                continue
            n_run = int(col.count)
            if col.mcount >= self.min_onset_steps:
                # The stricter run: a sharper onset and an undiluted ratio, unless the sensitive
                # run's earlier steps say the same (then the whole sensitive run measures it).
                n_run = int(col.mcount)
                magnitude = self._measure(col, magnitude, float(scale[i]))
            col.firing, col.below, col.recent = True, 0, magnitude
            col.source = 0 if src is None else int(src[i])
            col.onset = step - n_run + 1
            # With the trainer's clock: recorded now (info), a page once it has lasted.
            col.fire_ts = t if t == t else -1.0
            col.paged = t != t
            out.append(self._finding(step, rank, col, magnitude, n_run, v[i], med[i],
                                     self._severity(magnitude) if col.paged else "info", t))
        return out

    def _measure(self, col: "_Column", sensitive: float, noise: float) -> float:
        """The ratio a finding reports, when the stricter run is long enough to date the onset.

        The stricter CUSUM's run dates the onset sharply, but it restarts whenever it touches
        zero, so under heavy jitter its run may be a few steps that began on a noisy high (a
        1.1x straggler under 6 % jitter: 3 steps measuring 1.17). When it is shorter than
        ``min_measure_steps`` (8: from there its mean is within about 2 % under 6 % jitter),
        the sensitive run's earlier steps (before the stricter run began) are looked at: their
        weighted mean ``m_e`` is the two run levels' difference over its weights (the same EWMA
        weights, so exact). When ``m_e`` agrees with the stricter run's ratio within 3 standard
        errors of the per-step noise, the rank was as slow then and the sensitive run (more
        steps) measures the ratio; otherwise (the sensitive run began on noise before the fault,
        or a rank's hardware offset kept it running for long) the stricter run alone does.

        The onset stays the stricter run's: agreeing within the noise is no proof that a mild
        straggler's earlier steps were already slow.
        """
        d = 1.0 - self.level_alpha
        m_n, c_n = float(col.mcount), float(col.count)
        strict = float(col.mlevel) / (1.0 - d ** m_n)
        earlier_n, earlier_w = c_n - m_n, d ** m_n - d ** c_n
        if m_n >= self.min_measure_steps or earlier_n < 1.0 or earlier_w <= 0.0:
            return strict
        earlier = (float(col.level) - float(col.mlevel)) / earlier_w
        if abs(earlier - strict) <= 3.0 * noise * (1.0 / m_n + 1.0 / earlier_n) ** 0.5:
            return sensitive
        return strict

    def _severity(self, ratio: float) -> Severity:
        return "critical" if ratio >= self.critical_ratio else "warning"

    def _finding(self, step: int, rank: int, col: "_Column", ratio: float, n_run: int,
                 value: float, median: float, severity: Severity, t: float) -> Finding:
        score = min(1.0, max(0.0, (ratio - self.min_ratio) / (self.critical_ratio - self.min_ratio)))
        evidence = {"ratio": round(ratio, 4), "value_s": float(value),
                    "peer_median_s": float(median), "source": SOURCES[col.source],
                    "cusum": round(float(col.cusum), 2), "steps_since_onset": n_run}
        if t == t and col.fire_ts >= 0:
            evidence.update(lasted_s=round(t - col.fire_ts, 3), min_duration_s=self.min_duration_s)
        return Finding(kind=self.kind, step=step, ranks=(rank,), severity=severity,
                       score=round(score, 4), metric=SOURCES[col.source],
                       onset_step=col.onset if col.onset is not None else step - n_run + 1,
                       evidence=evidence)


class _Column:
    """One rank's scalar state while it is replayed."""
    __slots__ = ("cusum", "mcusum", "mlevel", "mcount", "level", "count", "firing", "below",
                 "source", "recent", "fire_ts", "paged", "onset")

    def __init__(self, cusum: float, mcusum: float, mlevel: float, mcount: float, level: float,
                 count: float, firing: bool,
                 below: int, source: int, recent: float, fire_ts: float = -1.0,
                 paged: bool = False) -> None:
        self.cusum, self.mcusum, self.level, self.count = cusum, mcusum, level, count
        self.mlevel, self.mcount = mlevel, mcount
        self.firing, self.below, self.source, self.recent = firing, below, source, recent
        self.fire_ts, self.paged = fire_ts, paged
        self.onset: int | None = None
