"""A run's stored history as one columnar table, for analysts and the onset estimator.

Rows are sorted by (step, rank); the ``attempt`` column says which attempt each row came from.
By default only the effective history is returned (the newest attempt wins for each step).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from healthsvc.store.batch import MetricBatch
from healthsvc.store.interface import Store


@dataclass
class History:
    steps: np.ndarray
    ranks: np.ndarray
    attempts: np.ndarray
    values: dict[str, np.ndarray] = field(default_factory=dict)
    present: dict[str, np.ndarray] = field(default_factory=dict)
    hosts: list[str | None] = field(default_factory=list)  # per row; empty when no host reported
    labels: dict[str, list[str | None]] = field(default_factory=dict)  # string field -> per row

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def fields(self) -> list[str]:
        return list(self.values)


def iter_history_batches(store: Store, run_id: str, *, step_min: int | None = None,
                         step_max: int | None = None, ranks: set[int] | None = None,
                         fields: set[str] | None = None, attempt: int | None = None,
                         ) -> Iterator[tuple[int, MetricBatch]]:
    for chunk_attempt, batch in store.reads.iter_chunks(run_id, step_min=step_min, step_max=step_max,
                                                        attempt=attempt, fields=fields):
        if ranks is not None:
            keep = np.isin(batch.ranks, np.fromiter(ranks, dtype=np.int64))
            if not keep.any():
                continue
            if not keep.all():
                batch = batch.take(keep)
        yield chunk_attempt, batch


def load_history(store: Store, run_id: str, **filters) -> History:
    parts = list(iter_history_batches(store, run_id, **filters))
    return concat_batches(parts)


def concat_batches(parts: list[tuple[int, MetricBatch]]) -> History:
    if not parts:
        return History(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    steps = np.concatenate([b.steps for _, b in parts])
    ranks = np.concatenate([b.ranks for _, b in parts])
    attempts = np.concatenate([np.full(len(b), a, dtype=np.int64) for a, b in parts])
    names: list[str] = []
    for _, b in parts:
        names.extend(f for f in b.values if f not in names)
    values, present = {}, {}
    for f in names:
        values[f] = np.concatenate([b.values[f] if f in b.values else np.full(len(b), np.nan) for _, b in parts])
        present[f] = np.concatenate([b.present[f] if f in b.present else np.zeros(len(b), bool) for _, b in parts])
    hosts: list[str | None] = []
    if any(b.host_index is not None for _, b in parts):
        for _, b in parts:
            if b.host_index is None:
                hosts.extend([None] * len(b))
            else:
                lookup = np.array(b.host_names + [None], dtype=object)
                hosts.extend(lookup[b.host_index].tolist())
    labels: dict[str, list[str | None]] = {}
    for f in dict.fromkeys(f for _, b in parts for f in b.labels):
        labels[f] = [v for _, b in parts
                     for v in (b.label_column(f) if f in b.labels else [None] * len(b))]
    order = np.lexsort((ranks, steps))
    if not np.array_equal(order, np.arange(len(order))):
        steps, ranks, attempts = steps[order], ranks[order], attempts[order]
        values = {f: v[order] for f, v in values.items()}
        present = {f: p[order] for f, p in present.items()}
        if hosts:
            hosts = [hosts[i] for i in order.tolist()]
        labels = {f: [col[i] for i in order.tolist()] for f, col in labels.items()}
    return History(steps, ranks, attempts, values, present, hosts, labels)
