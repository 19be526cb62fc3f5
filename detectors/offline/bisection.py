"""Active bisection over checkpoints: find the last clean checkpoint in O(log n) probes.

The user's probe job (the loss of a fixed batch, a comparison against a replica, ...) judges one
checkpoint at a time as *good* (holds no corrupted update) or *bad*. Corruption is monotone: once
an update is corrupted every later checkpoint is bad too, so the checkpoints form a good prefix and
a bad suffix, and a binary search finds the boundary.

With ``m`` undecided checkpoints between the known-good bound and the known-bad bound there are
``m + 1`` possible answers, so the search needs at most ``ceil(log2(m + 1))`` probes; when the
first checkpoint of the list is known good and the last known bad that is ``ceil(log2(n - 1))``,
never more than ``ceil(log2 n)``.

The state machine is pure and serialisable (``to_dict`` / ``from_dict``) so a service can persist
it between HTTP calls.

Exceptions (all subclass :class:`BisectionError`, itself a ``ValueError``)::

    BisectionError
    ├── UnknownCheckpoint     a report or bound names a step that is not in the list
    ├── ProbeNotProposed      a report for an undecided step that was not the proposed probe
    └── ContradictoryReport   a report that breaks monotonicity (bad before good) or
                              changes the verdict of a step already decided

Example:

>>> b = Bisection.start([100, 200, 300, 400, 500, 600, 700, 800])
>>> while (step := b.next_probe()) is not None:
...     b.report(step, good=step <= 500)
>>> b.result(), b.first_bad(), b.n_probes
(500, 600, 3)
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Sequence


class BisectionError(ValueError):
    """Root of the bisection errors."""


class UnknownCheckpoint(BisectionError):
    """A step that is not one of the bisection's checkpoints."""


class ProbeNotProposed(BisectionError):
    """A report for an undecided checkpoint that the bisection did not propose."""


class ContradictoryReport(BisectionError):
    """A report that contradicts what is already known (a bad checkpoint before a good one)."""


@dataclass(frozen=True)
class ProbeReport:
    """One probe outcome as reported by the user (``value`` is the probe's own number, if any)."""

    step: int
    good: bool
    value: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "good": self.good, "value": self.value}


class Bisection:
    """Binary search for the last good checkpoint of an ordered list.

    State is two positions in ``steps``: ``_good`` (index of the newest checkpoint known good,
    -1 if none) and ``_bad`` (index of the oldest checkpoint known bad, ``len(steps)`` if none).
    ``known_good`` / ``known_bad`` may be steps outside the list (say, an older checkpoint probed
    earlier, or the detection step): every listed step at or before ``known_good`` counts as good,
    every listed step at or after ``known_bad`` as bad.
    """

    def __init__(self, steps: Sequence[int], known_good: int | None = None,
                 known_bad: int | None = None) -> None:
        ordered = sorted({int(s) for s in steps})
        if len(ordered) != len(steps):
            raise BisectionError(f"checkpoint steps must be unique; got {list(steps)}")
        if known_good is not None and known_bad is not None and known_good >= known_bad:
            raise ContradictoryReport(
                f"known_good={known_good} is not before known_bad={known_bad}: a checkpoint "
                "cannot be clean after a corrupted one")
        self.steps: list[int] = ordered
        self.known_good = known_good
        self.known_bad = known_bad
        self._good = -1 if known_good is None else _count_at_or_before(ordered, known_good) - 1
        self._bad = len(ordered) if known_bad is None else _count_before(ordered, known_bad)
        self._pending: int | None = None
        self.reports: list[ProbeReport] = []

    @classmethod
    def start(cls, checkpoint_steps: Sequence[int], known_good: int | None = None,
              known_bad: int | None = None) -> "Bisection":
        """Start a bisection over ``checkpoint_steps`` (any order; duplicates are an error)."""
        return cls(checkpoint_steps, known_good=known_good, known_bad=known_bad)

    # -- the protocol ------------------------------------------------------------------------

    def next_probe(self) -> int | None:
        """The checkpoint step to probe next, or None when the boundary is found.

        Calling it again before a report returns the same step.
        """
        if self._pending is None and not self.done:
            self._pending = self._midpoint()
        return None if self._pending is None else self.steps[self._pending]

    def _midpoint(self) -> int:
        return (self._good + self._bad) // 2

    def report(self, step: int, good: bool, value: float | None = None) -> None:
        """Record the probe outcome of checkpoint ``step``.

        A repeated report that agrees with what is known is accepted and changes nothing (retries
        are safe). Raises :class:`ContradictoryReport` when the verdict contradicts an earlier one,
        :class:`ProbeNotProposed` for an undecided step other than the proposed one, and
        :class:`UnknownCheckpoint` for a step not in the list.
        """
        step = int(step)
        good = bool(good)
        try:
            index = self.steps.index(step)
        except ValueError:
            raise UnknownCheckpoint(
                f"step {step} is not a checkpoint of this bisection; checkpoints: "
                f"{_short(self.steps)}") from None
        if index <= self._good:
            if not good:
                raise ContradictoryReport(
                    f"checkpoint {step} reported bad, but checkpoint {self._good_step()} at or "
                    f"after it is known good ({self._why_good()}); corruption cannot heal, so "
                    "one of the two probes is wrong")
            return
        if index >= self._bad:
            if good:
                raise ContradictoryReport(
                    f"checkpoint {step} reported good, but checkpoint {self._bad_step()} at or "
                    f"before it is known bad ({self._why_bad()}); corruption cannot heal, so "
                    "one of the two probes is wrong")
            return
        if self._pending is None or index != self._pending:
            proposed = None if self._pending is None else self.steps[self._pending]
            raise ProbeNotProposed(
                f"checkpoint {step} is undecided but was not proposed; report the proposed "
                f"probe {proposed} (call next_probe() first)")
        self.reports.append(ProbeReport(step, good, None if value is None else float(value)))
        if good:
            self._good = index
        else:
            self._bad = index
        self._pending = None

    # -- answers ---------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True when no checkpoint is left undecided."""
        return self._bad - self._good <= 1

    def result(self) -> int | None:
        """The newest step known good: a listed checkpoint, else ``known_good``, else None.

        Final once :attr:`done`; before that it is the best answer so far.
        """
        if self._good >= 0:
            return self.steps[self._good]
        return self.known_good

    def first_bad(self) -> int | None:
        """The oldest step known bad (a listed checkpoint, else ``known_bad``, else None)."""
        if self._bad < len(self.steps):
            return self.steps[self._bad]
        return self.known_bad

    @property
    def n_probes(self) -> int:
        return len(self.reports)

    def remaining_probes(self) -> int:
        """Worst-case number of probes still needed: ceil(log2(undecided + 1))."""
        undecided = self._bad - self._good - 1
        return math.ceil(math.log2(undecided + 1)) if undecided > 0 else 0

    # -- persistence -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; ``from_dict(to_dict())`` resumes exactly."""
        return {
            "steps": list(self.steps),
            "known_good": self.known_good,
            "known_bad": self.known_bad,
            "good_index": self._good,
            "bad_index": self._bad,
            "pending_index": self._pending,
            "reports": [r.to_dict() for r in self.reports],
            "done": self.done,
            "result": self.result(),
            "first_bad": self.first_bad(),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> "Bisection":
        b = cls(state["steps"], known_good=state.get("known_good"),
                known_bad=state.get("known_bad"))
        good, bad = int(state["good_index"]), int(state["bad_index"])
        pending = state.get("pending_index")
        if not (-1 <= good < bad <= len(b.steps)):
            raise BisectionError(f"corrupt bisection state: good_index={good}, bad_index={bad}")
        if pending is not None and not (good < int(pending) < bad):
            raise BisectionError(f"corrupt bisection state: pending_index={pending} outside "
                                 f"({good}, {bad})")
        b._good, b._bad = good, bad
        b._pending = None if pending is None else int(pending)
        b.reports = [ProbeReport(int(r["step"]), bool(r["good"]), r.get("value"))
                     for r in state.get("reports", [])]
        return b

    def __repr__(self) -> str:
        upcoming = None if self.done else self.steps[
            self._pending if self._pending is not None else self._midpoint()]
        return (f"Bisection(n={len(self.steps)}, last_good={self.result()}, "
                f"first_bad={self.first_bad()}, next_probe={upcoming}, probes={self.n_probes})")

    # -- helpers for messages --------------------------------------------------------------------

    def _good_step(self) -> int:
        return self.steps[self._good]

    def _bad_step(self) -> int:
        return self.steps[self._bad]

    def _why_good(self) -> str:
        step = self._good_step()
        if any(r.step == step for r in self.reports):
            return "reported good"
        return f"at or before known_good={self.known_good}"

    def _why_bad(self) -> str:
        step = self._bad_step()
        if any(r.step == step for r in self.reports):
            return "reported bad"
        return f"at or after known_bad={self.known_bad}"


def _count_at_or_before(ordered: list[int], step: int) -> int:
    return bisect.bisect_right(ordered, step)


def _count_before(ordered: list[int], step: int) -> int:
    return bisect.bisect_left(ordered, step)


def _short(steps: list[int], limit: int = 8) -> str:
    if len(steps) <= limit:
        return str(steps)
    return f"[{steps[0]}, {steps[1]}, ..., {steps[-1]}] ({len(steps)} steps)"
