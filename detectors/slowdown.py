"""Slowdown: the whole job's step time shifts up (a change point), run-wide.

Maths, per step ``t`` (sequential over steps; the only per-rank work is one median):

- ``m[t] = log(median over ranks of step_time[t])`` (ranks missing at ``t`` are ignored; the
  median is taken over a fixed, id-ordered subset of at most ``max_reference_ranks`` ranks);
- after ``warmup_steps`` steps (compilation, cache warm-up), the next ``baseline_steps`` steps give
  the baseline ``mu = median(m)`` and ``sigma = max(1.4826 * MAD(m), scale_floor)`` (log units);
- an upper CUSUM ``S = max(0, S + min((m - mu) / sigma, z_clip) - cusum_k)``: a single slow step
  (a checkpoint write, a GC pause) adds at most ``z_clip - cusum_k``, so it takes a run of them;
- the size of the shift is ``ratio = exp(median(m since the CUSUM left zero) - mu)`` over at most
  the last ``history_steps`` steps (a median, so a checkpoint step inside the run does not
  inflate it).

It fires when ``S >= cusum_h`` and ``ratio >= min_ratio``; the onset is the first step of that
CUSUM run. **A shift must last to matter**: when the records carry ``ts`` (the trainer's clock), the
first finding is ``info`` (recorded, no page) and the episode becomes a ``warning`` (or
``critical``) only once the job has been slow without a break for ``min_duration_s`` of trainer
time (an EWMA of ``m - mu``, gain 0.1, above ``log(min_ratio)`` all along; it breaks below
``log(resolve_ratio)``), so a blip
of a few seconds on a shared machine never pages, while a replay or backlog that arrives compressed
is judged by when the steps ran, not when they arrived. Without ``ts`` the first finding already
carries the severity. While in control (``S == 0``) the baseline follows slow drift (``baseline_alpha`` per
step). It resolves once the median of the last ``resolve_steps`` steps is below
``resolve_ratio`` times the baseline. Severity: ``critical`` from ``critical_ratio`` on, else
``warning``; ``score = (ratio - min_ratio) / (critical_ratio - min_ratio)`` clipped to [0, 1].

A straggler in synchronous training also slows the whole job, so both kinds can fire; the
straggler names the cause.

Example (every rank's step time 1.25x from step 400)::

    >>> import numpy as np
    >>> from healthsvc_detectors.frame import StepBlock, fill_trainer_time, trainer_time
    >>> rng = np.random.default_rng(0)
    >>> st = 0.5 * np.exp(rng.normal(0, 0.01, (800, 8))) * np.where(np.arange(800) >= 400, 1.25, 1.0)[:, None]
    >>> out = SlowdownDetector().update(StepBlock.from_dense(np.arange(800), np.arange(8), step_time=st))
    >>> [(f.step, f.onset_step, f.evidence["ratio"]) for f in out]
    [(406, 400, 1.2533)]
"""
from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

from healthsvc_detectors.base import BlockDetector, Detector
from healthsvc_detectors.finding import Finding, Severity
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.frame import StepBlock, fill_trainer_time, trainer_time


class SlowdownDetector(Detector, BlockDetector):
    """The whole job got slower (kind ``slowdown``, metric ``step_time``); blames no rank."""

    kind = "slowdown"
    kinds = (Kind("slowdown", "The whole job got slower than its own recent step time.", resolves="condition", mutes=frozenset(),
                  corruption=None, heals=True, onset_guessed=False, probe=False, incident=None,
                  restarts_at=None, blames_host=False, label="job slowdown", colour="#bcbd22"),)

    def __init__(
        self,
        min_ratio: float = 1.1,
        critical_ratio: float = 1.5,
        cusum_k: float = 1.0,
        cusum_h: float = 20.0,
        z_clip: float = 4.0,
        history_steps: int = 64,
        resolve_ratio: float = 1.05,
        resolve_steps: int = 20,
        warmup_steps: int = 50,
        baseline_steps: int = 100,
        baseline_alpha: float = 0.002,
        scale_floor: float = 0.01,
        max_reference_ranks: int = 512,
        min_duration_s: float = 300.0,
    ) -> None:
        if not 1.0 < resolve_ratio < min_ratio < critical_ratio:
            raise ValueError("need 1 < resolve_ratio < min_ratio < critical_ratio, got "
                             f"{resolve_ratio}, {min_ratio}, {critical_ratio}")
        self.min_ratio = min_ratio
        self.critical_ratio = critical_ratio
        self.cusum_k = cusum_k
        self.cusum_h = cusum_h
        self.z_clip = z_clip
        self.history_steps = history_steps
        self.resolve_ratio = resolve_ratio
        self.resolve_steps = resolve_steps
        self.warmup_steps = warmup_steps
        self.baseline_steps = baseline_steps
        self.baseline_alpha = baseline_alpha
        self.scale_floor = scale_floor
        self.max_reference_ranks = max_reference_ranks
        self.min_duration_s = min_duration_s
        super().__init__()

    def _reset(self) -> None:
        self._seen = 0                    # steps with a usable median
        self._window: list[float] = []    # log medians collected for the baseline
        self._mu: float | None = None     # baseline log step time
        self._sigma = self.scale_floor
        self._cusum = 0.0
        self._recent: list[float] = []    # the last history_steps log medians
        self._run_start = 0
        self._firing = False
        self._since_fire = 0
        self._level = 0.0                      # EWMA of m - mu (log units)
        self._slow_since: float | None = None  # trainer time since which the level stayed slow
        self._last_ts: float | None = None     # the latest trainer time seen
        self._pending: dict[str, Any] | None = None   # an info episode waiting to last
        self._ref_cols: np.ndarray | None = None   # cached positions of the reference subset

    _FIELDS = ("seen", "window", "mu", "sigma", "cusum", "recent", "run_start", "firing",
               "since_fire", "pending", "level", "slow_since", "last_ts")

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, "_" + name) for name in self._FIELDS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        for name in self._FIELDS:
            if name in state:
                setattr(self, "_" + name, state[name])
        self._window = [float(x) for x in self._window]
        self._recent = [float(x) for x in self._recent]

    def _log_medians(self, block: StepBlock) -> np.ndarray:
        """``log(median step_time)`` per step; NaN where no rank reported a usable time."""
        st, ok = block.values["step_time"], block.present["step_time"]
        r, m = block.n_ranks, self.max_reference_ranks
        if r > m:
            ids = block.ranks
            if self._ref_cols is None or len(self._ref_cols) != m or self._ref_cols[-1] != r - 1:
                self._ref_cols = np.linspace(0, r - 1, m).astype(np.int64)
            cols = self._ref_cols
            if not (ids[1:] > ids[:-1]).all():
                # Id order makes the subset independent of how the caller ordered the columns.
                cols = np.argsort(ids, kind="stable")[cols]
            st, ok = st[:, cols], ok[:, cols]
        # min/max propagate NaN: two reductions say "every value usable" without temporaries.
        if ok.all() and st.min() > 0 and st.max() < np.inf:
            # A sort and two picks: np.median's own overhead is larger than the work here.
            srt = np.sort(st, axis=1)
            m = srt.shape[1]
            return np.log(0.5 * (srt[:, (m - 1) // 2] + srt[:, m // 2]))
        ok = ok & (st > 0) & np.isfinite(st)
        out = np.full(len(st), np.nan)
        for i in range(len(st)):   # rows with missing ranks: steps, not ranks
            if ok[i].any():
                out[i] = math.log(float(np.median(st[i, ok[i]])))
        return out

    def update(self, block: StepBlock) -> list[Finding]:
        if block.n_steps == 0 or block.n_ranks == 0 or "step_time" not in block.values:
            return []
        logs = self._log_medians(block)
        ts, self._last_ts = fill_trainer_time(trainer_time(block), self._last_ts)
        out: list[Finding] = []
        for step, m, t in zip(block.steps.tolist(), logs.tolist(), ts.tolist()):
            if m != m:  # NaN: nobody reported this step
                continue
            finding = self._step(step, m, None if t != t else t)
            if finding is not None:
                out.append(finding)
        return out

    def _step(self, step: int, m: float, ts: float | None = None) -> Finding | None:
        self._seen += 1
        if self._mu is None:
            if self._seen > self.warmup_steps:
                self._window.append(m)
                if len(self._window) >= self.baseline_steps:
                    w = np.asarray(self._window)
                    self._mu = float(np.median(w))
                    self._sigma = max(1.4826 * float(np.median(np.abs(w - self._mu))),
                                      self.scale_floor)
                    self._window = []
                    self._run_start = step + 1
            return None
        self._recent.append(m)
        if len(self._recent) > self.history_steps:
            del self._recent[0]
        excess = m - self._mu
        z = min(excess / self._sigma, self.z_clip)
        self._cusum = max(self._cusum + z - self.cusum_k, 0.0)
        self._level += 0.1 * (excess - self._level)
        if self._level >= math.log(self.min_ratio):
            if self._slow_since is None:
                self._slow_since = ts
        elif self._level < math.log(self.resolve_ratio):
            self._slow_since = None
        if self._cusum == 0.0:
            self._run_start = step + 1
            if self._pending is not None:     # the shift ended before it mattered
                self._pending = None
                return Finding(kind=self.kind, step=step, severity="info", metric="step_time",
                               status="resolved", evidence={"reason": "ended before min_duration_s",
                                                            "min_duration_s": self.min_duration_s})
            if not self._firing:
                # Follow slow drift only while in control, with the clipped excess.
                self._mu += self.baseline_alpha * max(-self.z_clip, z) * self._sigma
        if self._pending is not None:
            if self._level < math.log(self.resolve_ratio):
                # Back to normal before it mattered: close it now, so a later slowdown is a new
                # episode with its own onset (the CUSUM would take long to drain).
                self._pending, self._cusum, self._run_start = None, 0.0, step + 1
                return Finding(kind=self.kind, step=step, severity="info", metric="step_time",
                               status="resolved", evidence={"reason": "ended before min_duration_s",
                                                            "min_duration_s": self.min_duration_s})
            return self._promote(step, m, ts, self._mu)
        if self._firing:
            self._since_fire += 1
            if self._since_fire < self.resolve_steps:
                return None
            ratio = math.exp(statistics.median(self._recent[-self.resolve_steps:]) - self._mu)
            if ratio >= self.resolve_ratio:
                return None
            self._firing, self._cusum, self._run_start = False, 0.0, step + 1
            return Finding(kind=self.kind, step=step, severity="info", metric="step_time",
                           status="resolved",
                           evidence={"ratio": round(ratio, 4),
                                     "baseline_s": round(math.exp(self._mu), 6)})
        if self._cusum < self.cusum_h:
            return None
        n_run = min(max(1, step - self._run_start + 1), len(self._recent))
        # The median since onset ignores the odd slow step (checkpoint, GC) inside the run.
        ratio = math.exp(statistics.median(self._recent[-n_run:]) - self._mu)
        if ratio < self.min_ratio:
            return None
        if ts is not None and (self._slow_since is None or ts - self._slow_since < self.min_duration_s):
            # Recorded now; a page only if it lasts (see _promote).
            self._pending = {"onset": self._run_start}
            return self._finding(step, m, ratio, n_run, "info", ts, self._mu)
        self._firing, self._since_fire = True, 0
        return self._finding(step, m, ratio, n_run, self._severity(ratio), ts, self._mu)

    def _severity(self, ratio: float) -> Severity:
        return "critical" if ratio >= self.critical_ratio else "warning"

    def _promote(self, step: int, m: float, ts: float | None, mu: float) -> Finding | None:
        """An info episode becomes a page once it has lasted ``min_duration_s`` (and still has
        the size to matter). ``mu``: the baseline (``_mu``, known by then)."""
        if ts is None or self._slow_since is None or ts - self._slow_since < self.min_duration_s:
            return None
        n_run = min(max(1, step - self._run_start + 1), len(self._recent))
        ratio = math.exp(statistics.median(self._recent[-n_run:]) - mu)
        if ratio < self.min_ratio:
            return None
        self._pending = None
        self._firing, self._since_fire = True, 0
        return self._finding(step, m, ratio, n_run, self._severity(ratio), ts, mu)

    def _finding(self, step: int, m: float, ratio: float, n_run: int, severity: Severity,
                 ts: float | None, mu: float) -> Finding:
        score = min(1.0, max(0.0, (ratio - self.min_ratio) / (self.critical_ratio - self.min_ratio)))
        evidence = {"ratio": round(ratio, 4), "baseline_s": round(math.exp(mu), 6),
                    "median_s": round(math.exp(m), 6), "sigma_log": round(self._sigma, 5),
                    "cusum": round(self._cusum, 2), "steps_since_onset": n_run}
        if ts is not None and self._slow_since is not None:
            evidence.update(slow_for_s=round(ts - self._slow_since, 3), min_duration_s=self.min_duration_s)
        return Finding(kind=self.kind, step=step, severity=severity, score=round(score, 4),
                       metric="step_time", onset_step=self._run_start, evidence=evidence)
