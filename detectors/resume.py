"""``resume_mismatch``: a restart from a checkpoint that does not continue the run.

The corruption of a restart that raises no error: the data loader starting again from the
beginning of the stream (recent examples seen again at once), the learning-rate schedule starting
again from its first step. After a restart from checkpoint ``c`` (a new attempt whose first step is
``c + 1``), the first ``check_steps`` steps must continue the run's data position (``data_cursor``)
and learning rate (``lr``): equal to what the abandoned attempt reported at ``c + 1, c + 2, ...``
where it got that far (``reference = "abandoned_attempt"``), else to the trend of its last two
steps before the resume extrapolated (``reference = "trend"``; a schedule is locally linear).

Per step the detector reads the median over ranks of each metric (both are the same on every rank
of a plain data-parallel job), so its memory is ``memory_steps`` steps, not steps x ranks: a resume
further back than that is not judged. Tolerances are relative: ``rtol`` when the abandoned attempt
reported the step (a restored schedule gives the same float), ``trend_rtol`` against the trend.

One ``critical`` finding (score 1) per metric and resume, at the first step that did not continue,
with ``expected`` and ``got``. The caller signals the new attempt with :meth:`new_attempt` (the
other detectors are reset; this one keeps what the abandoned attempt reported).

A restart the caller cannot see as a new attempt (the abandoned attempt stopped right after the
checkpoint, so no step repeats) still shows in the data position: ``data_cursor`` going back
between two consecutive reported steps of one attempt is a sampler that started again
(``reference = "previous_step"``, expected: the previous step's value plus its usual increment).

>>> import numpy as np
>>> from healthsvc_detectors.frame import StepBlock
>>> det = ResumeMismatchDetector()
>>> det.update(StepBlock.from_dense(np.arange(10), [0], data_cursor=8.0 * np.arange(1, 11)[:, None]))
[]
>>> det.new_attempt()   # resumed from the checkpoint of step 5 with the sampler at 0
>>> [(f.step, f.metric, f.evidence["expected"], f.evidence["got"]) for f in
...  det.update(StepBlock.from_dense([6, 7], [0], data_cursor=[[8.0], [16.0]]))]
[(6, 'data_cursor', 56.0, 8.0)]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from healthsvc_detectors.base import BlockDetector, Detector
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.frame import StepBlock


class ResumeMismatchDetector(Detector, BlockDetector):
    """Checks that the first steps after a resume continue the data position and learning rate.

    Parameters
    ----------
    metrics: the values that must continue across a resume.
    check_steps: steps of the new attempt judged (from its first step).
    memory_steps: newest steps remembered per metric (older resumes are not judged).
    rtol: relative tolerance against the abandoned attempt's own value at the step.
    trend_rtol: relative tolerance against the extrapolated trend.
    cursor_metrics: metrics that never go back within an attempt (a data position).
    """

    kind = "resume_mismatch"
    kinds = (Kind("resume_mismatch", "A resume did not continue the checkpoint's data position or schedule.",
                  resolves="latched", mutes=frozenset(), corruption="abrupt", heals=False,
                  onset_guessed=False, probe=False, incident=None, restarts_at=None, blames_host=False, label="resume mismatch",
                  colour="#2ca02c"),)

    def __init__(self, metrics: tuple[str, ...] = ("data_cursor", "lr"), check_steps: int = 3,
                 memory_steps: int = 4096, rtol: float = 1e-4, trend_rtol: float = 0.05,
                 cursor_metrics: tuple[str, ...] = ("data_cursor",)) -> None:
        if check_steps < 1 or memory_steps < 2:
            raise ValueError("check_steps must be >= 1 and memory_steps >= 2")
        self.metrics = tuple(metrics)
        self.check_steps = check_steps
        self.memory_steps = memory_steps
        self.rtol = rtol
        self.trend_rtol = trend_rtol
        self.cursor_metrics = tuple(cursor_metrics)
        super().__init__()

    def _reset(self) -> None:
        self._memory: dict[str, dict[int, float]] = {m: {} for m in self.metrics}
        self._resume_at: int | None = None     # first step of the attempt being judged
        self._armed = False                    # a new attempt began; its first step not seen yet
        self._fired: set[str] = set()          # metrics found in this resume

    def new_attempt(self) -> None:
        """The run restarted: the next step seen is the first of the new attempt."""
        self._armed = True
        self._resume_at = None
        self._fired = set()

    def update(self, block: StepBlock) -> list[Finding]:
        out: list[Finding] = []
        metrics = [m for m in self.metrics if block.has(m)]
        if not metrics:
            return out
        medians = {}
        with np.errstate(all="ignore"):
            for m in metrics:
                medians[m] = _row_medians(block.values[m], block.present[m])
        for i, step in enumerate(block.steps.tolist()):
            if self._armed:
                self._armed, self._resume_at = False, step
            judging = self._resume_at is not None and step < self._resume_at + self.check_steps
            for m in metrics:
                got = medians[m][i]
                if got != got:
                    continue
                # (judging implies _resume_at is set; the check only names it for the type checker)
                if judging and self._resume_at is not None and m not in self._fired:
                    out += self._judge(m, step, float(got), self._resume_at)
                elif m in self.cursor_metrics:
                    out += self._went_back(m, step, float(got))
                self._remember(m, step, float(got))
        return out

    def _went_back(self, metric: str, step: int, got: float) -> list[Finding]:
        """A data position lower than at the previous reported step of the same attempt."""
        memory = self._memory[metric]
        if not memory:
            return []
        last_step = next(reversed(memory))
        if last_step >= step or got >= memory[last_step]:
            return []
        before = [s for s in list(memory)[-2:] if s < step]
        rate = ((memory[before[1]] - memory[before[0]]) / (before[1] - before[0])
                if len(before) == 2 and before[1] > before[0] else 0.0)
        expected = memory[last_step] + rate * (step - last_step)
        return [Finding(
            kind=self.kind, step=step, severity="critical", score=1.0, metric=metric,
            onset_step=step,
            evidence={"expected": expected, "got": got, "reference": "previous_step",
                      "resumed_at": step, "resumed_from_step": None,
                      "what": _WHAT.get(metric, metric)})]

    def _judge(self, metric: str, step: int, got: float, resume_at: int) -> list[Finding]:
        memory = self._memory[metric]
        expected, reference, rtol = memory.get(step), "abandoned_attempt", self.rtol
        if expected is None:
            before = sorted(s for s in memory if s < resume_at)[-2:]
            if len(before) < 2:
                return []   # nothing reported before the resume: nothing to continue
            (s1, v1), (s2, v2) = [(s, memory[s]) for s in before]
            expected = v2 + (v2 - v1) / (s2 - s1) * (step - s2)
            reference, rtol = "trend", self.trend_rtol
        if abs(got - expected) <= rtol * max(abs(expected), abs(got)) + 1e-12:
            return []
        self._fired.add(metric)
        return [Finding(
            kind=self.kind, step=step, severity="critical", score=1.0, metric=metric,
            onset_step=step,
            evidence={"expected": expected, "got": got, "reference": reference,
                      "resumed_at": resume_at, "resumed_from_step": resume_at - 1,
                      "what": _WHAT.get(metric, metric)})]

    def _remember(self, metric: str, step: int, value: float) -> None:
        memory = self._memory[metric]
        memory[step] = value   # the newest attempt's value wins: it is the run's history now
        while len(memory) > self.memory_steps:   # dicts keep insertion order: the oldest first
            del memory[next(iter(memory))]

    def state_dict(self) -> dict[str, Any]:
        return {"memory": {m: [[s, v] for s, v in sorted(d.items())] for m, d in self._memory.items()},
                "resume_at": self._resume_at, "armed": self._armed, "fired": sorted(self._fired)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        for m, pairs in state.get("memory", {}).items():
            if m in self._memory:
                self._memory[m] = {int(s): float(v) for s, v in pairs}
        self._resume_at = state.get("resume_at")
        self._armed = bool(state.get("armed", False))
        self._fired = set(state.get("fired", ()))


def _row_medians(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Per step, the median over ranks of the reported finite values (NaN where none). The usual
    case, every rank reporting the same value, costs a min and a max instead of a median."""
    if present.all() and np.isfinite(values).all():
        lo, hi = values.min(axis=1), values.max(axis=1)
        out = lo.copy()
        odd = lo != hi
        if odd.any():
            out[odd] = np.median(values[odd], axis=1)
        return out
    v = np.where(present & np.isfinite(values), values, np.nan)
    ok = ~np.isnan(v).all(axis=1)
    out = np.full(len(values), np.nan)
    if ok.any():
        out[ok] = np.nanmedian(v[ok], axis=1)
    return out


_WHAT = {"data_cursor": "the data position (the sampler did not continue where the checkpoint "
                        "left off)",
         "lr": "the learning rate (the schedule did not continue where the checkpoint left off)"}
