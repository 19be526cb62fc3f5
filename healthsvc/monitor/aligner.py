"""Aligns per-rank pushes into per-step frames (:class:`detectors.StepBlock`).

Ranks push on their own schedules, so records for one step arrive spread over time and across
requests. The aligner holds records until their step is complete — every expected rank has
reported — or until the step has waited ``timeout_s`` (the missing ranks are then masked, never
zero), and emits complete steps in step order. Complete steps are handed on in blocks of at least
``min_block_steps``, or once the oldest has waited ``max_block_wait_s``: a detector's update has a
fixed cost of tens of microseconds, so one call per 16 steps instead of one per step cuts the
detection cost several-fold, for at most a second of extra latency (non-finite values do not wait:
they are judged on arrival). A record for a step already emitted is late: it is
counted and dropped from the aligned view (it is still stored, and the non-finite check has
already seen it on arrival).

State is plain arrays, so it is serialisable with :meth:`state_dict`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from detectors.frame import StepBlock
from healthsvc.ingest.batch import MetricBatch


def batch_to_block(steps: np.ndarray, ranks: np.ndarray, values: dict[str, np.ndarray],
                   present: dict[str, np.ndarray]) -> StepBlock:
    """Scatter (step, rank) records into a dense steps x ranks block with presence masks.

    Later records win when a (step, rank) pair repeats."""
    if len(steps) and steps[0] == steps[-1] and len(ranks) > 1 and (np.diff(ranks) > 0).all() \
            and (steps == steps[0]).all():
        # One step of distinct ranks in order (what a rank-0 aggregator sends): no sorting.
        return StepBlock(steps=steps[:1], ranks=ranks,
                         values={f: np.where(present[f], v, np.nan)[None, :] for f, v in values.items()},
                         present={f: p[None, :] for f, p in present.items()})
    u_steps, si = np.unique(steps, return_inverse=True)
    u_ranks, ri = np.unique(ranks, return_inverse=True)
    shape = (len(u_steps), len(u_ranks))
    block_values, block_present = {}, {}
    for f, v in values.items():
        mat = np.full(shape, np.nan)
        pres = np.zeros(shape, dtype=bool)
        p = present[f]
        mat[si[p], ri[p]] = v[p]
        pres[si[p], ri[p]] = True
        block_values[f], block_present[f] = mat, pres
    return StepBlock(steps=u_steps, ranks=u_ranks, values=block_values, present=block_present)


class StepAligner:
    def __init__(self, timeout_s: float = 5.0, max_pending_steps: int = 512, min_block_steps: int = 16,
                 max_block_wait_s: float = 1.0) -> None:
        self.timeout_s = timeout_s
        self.max_pending_steps = max_pending_steps
        self.min_block_steps = min_block_steps
        self.max_block_wait_s = max_block_wait_s
        self._reset()

    def __repr__(self) -> str:
        return (f"StepAligner(timeout_s={self.timeout_s}, pending={len(self._steps)} records, "
                f"emitted_upto={self.emitted_upto})")

    def _reset(self) -> None:
        self._steps = np.zeros(0, np.int64)
        self._ranks = np.zeros(0, np.int64)
        self._values: dict[str, np.ndarray] = {}
        self._present: dict[str, np.ndarray] = {}
        self._first_seen_step = np.zeros(0, np.int64)   # pending steps ...
        self._first_seen_s = np.zeros(0, np.float64)    # ... and when each first arrived
        self.emitted_upto = -1
        self.late_records = 0

    reset = _reset

    def add(self, batch: MetricBatch, now: float, expected_ranks: int) -> list[StepBlock]:
        keep = batch.steps > self.emitted_upto
        self.late_records += int((~keep).sum())
        if keep.any():
            b = batch if keep.all() else batch.take(keep)
            self._append(b, now)
        return self._emit(now, expected_ranks)

    def flush_due(self, now: float, expected_ranks: int) -> list[StepBlock]:
        return self._emit(now, expected_ranks)

    def flush_all(self) -> list[StepBlock]:
        return self._emit(float("inf"), 0)

    def _append(self, b: MetricBatch, now: float) -> None:
        n_old, n_new = len(self._steps), len(b)
        for f in set(self._values) | set(b.values):
            old_v = self._values.get(f, np.full(n_old, np.nan))
            old_p = self._present.get(f, np.zeros(n_old, bool))
            new_v = b.values.get(f, np.full(n_new, np.nan))
            new_p = b.present.get(f, np.zeros(n_new, bool))
            self._values[f] = np.concatenate([old_v, new_v])
            self._present[f] = np.concatenate([old_p, new_p])
        self._steps = np.concatenate([self._steps, b.steps])
        self._ranks = np.concatenate([self._ranks, b.ranks])
        fresh = np.setdiff1d(np.unique(b.steps), self._first_seen_step)
        if len(fresh):
            self._first_seen_step = np.concatenate([self._first_seen_step, fresh])
            self._first_seen_s = np.concatenate([self._first_seen_s, np.full(len(fresh), now)])

    def _emit(self, now: float, expected_ranks: int) -> list[StepBlock]:
        if len(self._steps) == 0:
            return []
        u_steps, counts = np.unique(self._steps, return_counts=True)  # ranks per step (unique in an attempt)
        order = np.argsort(self._first_seen_step)
        first = self._first_seen_s[order][np.searchsorted(self._first_seen_step[order], u_steps)]
        ready = (counts >= max(expected_ranks, 1)) | (now - first >= self.timeout_s)
        # Too many steps waiting (a rank gone for good): let the oldest go.
        if len(u_steps) > self.max_pending_steps:
            ready[: len(u_steps) - self.max_pending_steps] = True
        # A step waits for all earlier steps: emit only the ready prefix (step order for detectors).
        n_ready = len(ready) if ready.all() else int(np.argmin(ready))
        if n_ready == 0:
            return []
        if n_ready < self.min_block_steps and now - float(first[0]) < self.max_block_wait_s \
                and len(u_steps) <= self.max_pending_steps:
            return []  # wait for a fuller block (flush_due on the ticker bounds the wait)
        upto = int(u_steps[n_ready - 1])
        out_mask = self._steps <= upto
        block = batch_to_block(self._steps[out_mask], self._ranks[out_mask],
                               {f: v[out_mask] for f, v in self._values.items()},
                               {f: p[out_mask] for f, p in self._present.items()})
        rest = ~out_mask
        self._steps, self._ranks = self._steps[rest], self._ranks[rest]
        self._values = {f: v[rest] for f, v in self._values.items()}
        self._present = {f: p[rest] for f, p in self._present.items()}
        still = self._first_seen_step > upto
        self._first_seen_step, self._first_seen_s = self._first_seen_step[still], self._first_seen_s[still]
        self.emitted_upto = upto
        return [block]

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self._steps.tolist(), "ranks": self._ranks.tolist(),
                # Floats may be NaN/Inf (data): the snapshot is written with a NaN-aware encoder.
                "values": {f: v.tolist() for f, v in self._values.items()},
                "present": {f: p.tolist() for f, p in self._present.items()},
                "first_seen_step": self._first_seen_step.tolist(), "first_seen_s": self._first_seen_s.tolist(),
                "emitted_upto": self.emitted_upto, "late_records": self.late_records}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        self._steps = np.asarray(state["steps"], dtype=np.int64)
        self._ranks = np.asarray(state["ranks"], dtype=np.int64)
        for f, vals in state["values"].items():
            self._values[f] = np.asarray(vals, dtype=np.float64).reshape(-1)
            self._present[f] = np.asarray(state["present"][f], dtype=bool).reshape(-1)
        self._first_seen_step = np.asarray(state["first_seen_step"], dtype=np.int64)
        self._first_seen_s = np.asarray(state["first_seen_s"], dtype=np.float64)
        self.emitted_upto = int(state["emitted_upto"])
        self.late_records = int(state["late_records"])
