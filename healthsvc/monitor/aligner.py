"""Aligns per-rank pushes into per-step frames (:class:`healthsvc_detectors.StepBlock`).

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

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.stats.state_json import array_from_json, array_to_json
from healthsvc.store.batch import MetricBatch


def batch_to_block(steps: np.ndarray, ranks: np.ndarray, values: dict[str, np.ndarray],
                   present: dict[str, np.ndarray]) -> StepBlock:
    """Scatter (step, rank) records into a dense steps x ranks block with presence masks.

    Later records win when a (step, rank) pair repeats."""
    if len(steps) == 1 or (len(steps) and steps[0] == steps[-1] and (np.diff(ranks) > 0).all()
                           and (steps == steps[0]).all()):
        # One step of distinct ranks in order (what a rank-0 aggregator sends, or one rank's
        # own push): no sorting.
        return StepBlock(steps=steps[:1], ranks=ranks,
                         values={f: _masked(v, present[f])[None, :] for f, v in values.items()},
                         present={f: p[None, :] for f, p in present.items()})
    width = _whole_steps(steps, ranks)
    if width:
        # Whole steps in order, each of the same ranks in order (one-step pushes of every rank
        # joined: the usual block): the records are the block, found without the two
        # inversions below (a dozen passes over the records, against three here).
        shape = (len(steps) // width, width)
        return StepBlock(steps=steps[::width].copy(), ranks=ranks[:width].copy(),
                         values={f: _masked(v, present[f]).reshape(shape) for f, v in values.items()},
                         present={f: p.reshape(shape) for f, p in present.items()})
    u_steps, si = _unique_inverse(steps)
    u_ranks, ri = _unique_inverse(ranks)
    shape = (len(u_steps), len(u_ranks))
    flat = si * shape[1] + ri          # each record's cell, row-major
    block_values, block_present = {}, {}
    if len(flat) == shape[0] * shape[1] and bool((flat == np.arange(len(flat))).all()):
        # Every cell once, step by step in rank order (one-step pushes of all ranks joined):
        # the records already are the block.
        for f, v in values.items():
            block_values[f] = _masked(v, present[f]).reshape(shape)
            block_present[f] = present[f].reshape(shape)
    else:
        for f, v in values.items():
            mat = np.full(shape[0] * shape[1], np.nan)
            pres = np.zeros(shape[0] * shape[1], dtype=bool)
            p = present[f]
            mat[flat[p]] = v[p]
            pres[flat[p]] = True
            block_values[f], block_present[f] = mat.reshape(shape), pres.reshape(shape)
    return StepBlock(steps=u_steps, ranks=u_ranks, values=block_values, present=block_present)


def _masked(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """The values, NaN where not reported: the column itself when every value was (the usual
    column; blocks are read, never written: the conformance suite checks every detector)."""
    return values if present.all() else np.where(present, values, np.nan)


def _whole_steps(steps: np.ndarray, ranks: np.ndarray) -> int:
    """``w`` when the records are steps of ``w`` records each, the steps increasing, and every
    step holds the same increasing rank ids in the same order; else 0."""
    n = len(steps)
    if n < 2:
        return 0
    width = int(np.argmax(steps != steps[0]))   # records of the first step (0: one step only)
    if width == 0 or n % width:
        return 0
    first = ranks[:width]
    if width > 1 and not (first[1:] > first[:-1]).all():
        return 0
    by_step, by_rank = steps.reshape(-1, width), ranks.reshape(-1, width)
    heads = by_step[:, 0]
    if (heads[1:] <= heads[:-1]).any() or not (by_step == heads[:, None]).all() or not (by_rank == first).all():
        return 0
    return width


def _step_counts(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(steps, return_counts=True)``; by runs, without a sort, when the steps come in
    order (a push of whole steps, or pushes joined in step order: nearly always)."""
    if len(steps) >= 64:   # below, the sort costs no more than the checks
        if steps[0] == steps[-1] and (steps == steps[0]).all():
            # One step (one step's ranks in one push, the usual push of a relay or an
            # aggregating rank 0): one comparison, not two diffs (3 us, not 18, at 1,024 records).
            return steps[:1], np.array([len(steps)])
        gaps = np.diff(steps)
        if (gaps >= 0).all():
            starts = np.flatnonzero(np.concatenate(([True], gaps != 0)))
            return steps[starts], np.diff(np.append(starts, len(steps)))
    return np.unique(steps, return_counts=True)


def _unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` for integers. Step and rank ids of a block span a
    range not much wider than the block: then a table over the range gives the same answer in
    linear time, where np.unique sorts (a sort of 16 steps x 1,024 ranks was most of a block)."""
    if len(a):
        lo, hi = int(a.min()), int(a.max())
        if hi - lo <= 4 * len(a) + 1024:
            seen = np.zeros(hi - lo + 1, dtype=bool)
            seen[a - lo] = True
            slot = np.cumsum(seen) - 1
            return np.flatnonzero(seen) + lo, slot[a - lo]
    return np.unique(a, return_inverse=True)


class StepAligner:
    def __init__(self, timeout_s: float = 5.0, max_pending_steps: int = 512, min_block_steps: int = 16,
                 max_block_wait_s: float = 1.0) -> None:
        self.timeout_s = timeout_s
        self.max_pending_steps = max_pending_steps
        self.min_block_steps = min_block_steps
        self.max_block_wait_s = max_block_wait_s
        self._reset()

    def __repr__(self) -> str:
        return (f"StepAligner(timeout_s={self.timeout_s}, pending={sum(self._count.values())} records, "
                f"emitted_upto={self.emitted_upto})")

    def _reset(self) -> None:
        # Pending records: the arrays below, then the batches in ``_chunks`` (oldest first), which
        # are joined onto them only when a block is cut or the state is saved. Pushes are often a
        # record or a few each, so joining every field's pending columns on every push cost more
        # than the detectors (per push, O(pending) copies and a sort of all pending steps).
        self._steps = np.zeros(0, np.int64)
        self._ranks = np.zeros(0, np.int64)
        self._values: dict[str, np.ndarray] = {}
        self._present: dict[str, np.ndarray] = {}
        self._chunks: list[MetricBatch] = []
        # Pending steps: records held per step (repeats included), and when each first arrived,
        # in order of arrival; kept as each batch comes, so deciding what is ready sorts steps only.
        self._count: dict[int, int] = {}
        self._first_seen: dict[int, float] = {}
        self.emitted_upto = -1
        self.late_records = 0

    reset = _reset

    def add(self, batch: MetricBatch, now: float, expected_ranks: int) -> list[StepBlock]:
        steps = batch.steps
        if len(steps) == 1:   # one record (a rank's own push): no mask
            if int(steps[0]) > self.emitted_upto:
                self._append(batch, now)
            else:
                self.late_records += 1
        elif len(steps):
            keep = steps > self.emitted_upto
            n_keep = int(keep.sum())
            self.late_records += len(steps) - n_keep
            if n_keep:
                self._append(batch if n_keep == len(steps) else batch.take(keep), now)
        return self._emit(now, expected_ranks)

    def flush_due(self, now: float, expected_ranks: int) -> list[StepBlock]:
        return self._emit(now, expected_ranks)

    def flush_all(self) -> list[StepBlock]:
        return self._emit(float("inf"), 0)

    def _append(self, b: MetricBatch, now: float) -> None:
        self._chunks.append(b)
        count, first_seen = self._count, self._first_seen
        if len(b) == 1:
            u, c = [int(b.steps[0])], [1]
        else:
            steps, counts = _step_counts(b.steps)
            u, c = steps.tolist(), counts.tolist()
        for step, n in zip(u, c):
            count[step] = count.get(step, 0) + n
            if step not in first_seen:
                first_seen[step] = now

    def _join(self) -> None:
        """Join the pending batches onto the pending arrays, in arrival order (a field a part
        lacks is not reported there: NaN, not present)."""
        if not self._chunks:
            return
        if len(self._chunks) == 1 and not len(self._steps):
            # Nothing pending but one batch (the usual case: the last block took every pending
            # step): the batch's columns are the join, not copies of them, when it has the
            # pending fields in their order (the aligner never writes into its columns).
            only = self._chunks[0]
            if list(only.values) == list(only.present) and list(self._values) == list(only.values)[:len(self._values)]:
                self._chunks = []
                self._steps, self._ranks = only.steps, only.ranks
                self._values, self._present = dict(only.values), dict(only.present)
                return
        parts = [MetricBatch(self._steps, self._ranks, self._values, self._present), *self._chunks]
        self._chunks = []
        fields = list(dict.fromkeys(f for part in parts for f in part.values))
        self._values = {f: np.concatenate([part.values[f] if f in part.values else np.full(len(part), np.nan)
                                           for part in parts]) for f in fields}
        self._present = {f: np.concatenate([part.present[f] if f in part.present else np.zeros(len(part), bool)
                                            for part in parts]) for f in fields}
        self._steps = np.concatenate([part.steps for part in parts])
        self._ranks = np.concatenate([part.ranks for part in parts])

    def _emit(self, now: float, expected_ranks: int) -> list[StepBlock]:
        count = self._count
        if not count:
            return []
        first_seen = self._first_seen
        u_steps = sorted(count)
        need = max(expected_ranks, 1)
        # Too many steps waiting (a rank gone for good): let the oldest go.
        forced = len(u_steps) - self.max_pending_steps
        # A step waits for all earlier steps: emit only the ready prefix (step order for detectors).
        n_ready = 0
        for step in u_steps:
            if not (n_ready < forced or count[step] >= need or now - first_seen[step] >= self.timeout_s):
                break
            n_ready += 1
        if n_ready == 0:
            return []
        if n_ready < self.min_block_steps and now - first_seen[u_steps[0]] < self.max_block_wait_s \
                and len(u_steps) <= self.max_pending_steps:
            return []  # wait for a fuller block (flush_due on the ticker bounds the wait)
        upto = u_steps[n_ready - 1]
        self._join()
        if n_ready == len(u_steps):
            # Every pending step goes (the usual case): the pending columns are the block's
            # records as they are; nothing stays.
            block = batch_to_block(self._steps, self._ranks, self._values, self._present)
            # Empty arrays of their own (a view, even empty, would keep the columns alive).
            self._steps, self._ranks = np.zeros(0, self._steps.dtype), np.zeros(0, self._ranks.dtype)
            self._values = {f: np.zeros(0, v.dtype) for f, v in self._values.items()}
            self._present = {f: np.zeros(0, p.dtype) for f, p in self._present.items()}
        else:
            out_mask = self._steps <= upto
            block = batch_to_block(self._steps[out_mask], self._ranks[out_mask],
                                   {f: v[out_mask] for f, v in self._values.items()},
                                   {f: p[out_mask] for f, p in self._present.items()})
            rest = ~out_mask
            self._steps, self._ranks = self._steps[rest], self._ranks[rest]
            self._values = {f: v[rest] for f, v in self._values.items()}
            self._present = {f: p[rest] for f, p in self._present.items()}
        for step in u_steps[:n_ready]:
            del count[step]
        self._first_seen = {s: t for s, t in first_seen.items() if s > upto}
        self.emitted_upto = upto
        return [block]

    def state_dict(self) -> dict[str, Any]:
        self._join()
        return {"steps": self._steps.tolist(), "ranks": self._ranks.tolist(),
                # Floats may be NaN/Inf (data): written as strings, the state is strict JSON
                # (the monitor's snapshot is written by orjson, which would make them null).
                "values": {f: array_to_json(v) for f, v in self._values.items()},
                "present": {f: p.tolist() for f, p in self._present.items()},
                "first_seen_step": list(self._first_seen), "first_seen_s": list(self._first_seen.values()),
                "emitted_upto": self.emitted_upto, "late_records": self.late_records}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        self._steps = np.asarray(state["steps"], dtype=np.int64)
        self._ranks = np.asarray(state["ranks"], dtype=np.int64)
        for f, vals in state["values"].items():   # raw NaN tokens in snapshots of earlier versions
            self._values[f] = array_from_json(vals, np.dtype(np.float64)).reshape(-1)
            self._present[f] = np.asarray(state["present"][f], dtype=bool).reshape(-1)
        first_step = np.asarray(state["first_seen_step"], dtype=np.int64).reshape(-1).tolist()
        first_s = np.asarray(state["first_seen_s"], dtype=np.float64).reshape(-1).tolist()
        self._first_seen = dict(zip(first_step, first_s))
        u, c = np.unique(self._steps, return_counts=True)
        self._count = dict(zip(u.tolist(), c.tolist()))
        for step in self._count:  # a state without a step's arrival time: count it as old
            self._first_seen.setdefault(step, min(first_s, default=0.0))
        self.emitted_upto = int(state["emitted_upto"])
        self.late_records = int(state["late_records"])
