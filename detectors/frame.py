"""The unit of input every streaming detector consumes: a block of steps x ranks.

``values[m]`` is an ``(n_steps, n_ranks)`` float64 array for metric ``m``; ``present[m]`` is a bool
array of the same shape. **NaN is data; missing is not**: where ``present`` is False the value is
undefined (it is stored as NaN only as filler) and must be ignored; where ``present`` is True a NaN
or an infinity is a real reported value.

Ranks are identified by id (``ranks`` holds the ids of the columns, sorted ascending). A block may
carry a different set of ranks than the previous one: new ranks appear, absent ones are simply not
there or masked. Steps are strictly increasing within a block; blocks arrive in step order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepBlock:
    steps: np.ndarray                      # (n,) int64, strictly increasing
    ranks: np.ndarray                      # (r,) int64, sorted ascending, unique
    values: dict[str, np.ndarray] = field(default_factory=dict)   # metric -> (n, r) float64
    present: dict[str, np.ndarray] = field(default_factory=dict)  # metric -> (n, r) bool

    def __post_init__(self) -> None:
        self.steps = np.asarray(self.steps, dtype=np.int64)
        self.ranks = np.asarray(self.ranks, dtype=np.int64)
        n, r = len(self.steps), len(self.ranks)
        for m, v in self.values.items():
            if v.shape != (n, r):
                raise ValueError(f"metric {m!r} has shape {v.shape}, expected {(n, r)}")
            if m not in self.present:
                # Every value given without a mask counts as reported.
                self.present[m] = np.ones((n, r), dtype=bool)
            elif self.present[m].shape != (n, r):
                raise ValueError(f"present mask of {m!r} has shape {self.present[m].shape}")

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    def has(self, metric: str) -> bool:
        """True when the metric was reported anywhere in this block."""
        return metric in self.present and bool(self.present[metric].any())

    def slice_steps(self, start: int, stop: int) -> "StepBlock":
        """Rows ``start:stop`` (positions, not step numbers) as a new block."""
        return StepBlock(
            steps=self.steps[start:stop], ranks=self.ranks,
            values={m: v[start:stop] for m, v in self.values.items()},
            present={m: p[start:stop] for m, p in self.present.items()},
        )

    def take_ranks(self, order: np.ndarray) -> "StepBlock":
        """Columns in the given positional order (used by permutation property tests)."""
        return StepBlock(
            steps=self.steps, ranks=self.ranks[order],
            values={m: v[:, order] for m, v in self.values.items()},
            present={m: p[:, order] for m, p in self.present.items()},
        )

    @classmethod
    def from_dense(cls, steps, ranks, **metrics: np.ndarray) -> "StepBlock":
        """Build a block where every given value is reported (NaN stays NaN: it is data)."""
        values = {m: np.asarray(v, dtype=np.float64) for m, v in metrics.items()}
        return cls(steps=np.asarray(steps), ranks=np.asarray(ranks), values=values,
                   present={m: np.ones(v.shape, dtype=bool) for m, v in values.items()})


def trainer_time(block: StepBlock) -> np.ndarray:
    """Per step, the trainer's clock (``ts``, seconds): the latest ``ts`` any rank reported for
    that step; NaN where none did (or the records carry no ``ts``). Timing detectors judge how long
    something lasted by it, so a replay or a backlog that arrives compressed is judged by when the
    steps really ran."""
    if "ts" not in block.values:
        return np.full(block.n_steps, np.nan)
    ts = np.where(block.present["ts"], block.values["ts"], np.nan)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(ts).any(axis=1)
        out = np.full(block.n_steps, np.nan)
        if ok.any():
            out[ok] = np.nanmax(ts[ok], axis=1)
    return out


def fill_trainer_time(ts: np.ndarray, last: float | None) -> tuple[np.ndarray, float | None]:
    """``ts`` with steps that carry no ``ts`` given the latest earlier one (``last`` from the
    previous block), and the new ``last``. A stream that carries the trainer's clock keeps it
    through a step whose records lack it, so such a step is not mistaken for "no clock"."""
    out = ts.copy()
    prev = np.nan if last is None else float(last)
    for i in range(len(out)):          # blocks are a few steps: a plain loop
        if out[i] == out[i]:
            prev = out[i]
        else:
            out[i] = prev
    return out, (None if prev != prev else float(prev))
