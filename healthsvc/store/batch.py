"""A validated batch of per-rank step records, held as columns.

``values[f]`` is float64; ``present[f]`` is False where the field was null or absent ("not
reported"). A NaN or infinity with ``present`` True is a real reported value: NaN is data.

String fields: ``host`` is held as ``host_names``/``host_index``; every other string field (such as
``param_digest``) as ``labels[f] = (names, index)``, ``index`` an int32 column into ``names`` with
-1 where the field was not reported.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, TypeVar, overload

import numpy as np

T = TypeVar("T")


class computed_once(Generic[T]):
    """``functools.cached_property`` without the lock Python 3.11's takes on every first read
    (3.12 dropped it): a batch's derived figures are read on the writer thread for every push.
    Two threads reading one first at the same time both compute the same value: harmless."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "computed_once[T]": ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: Any, owner: type | None = None) -> "T | computed_once[T]":
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass
class MetricBatch:
    steps: np.ndarray                                   # (n,) int64 >= 0
    ranks: np.ndarray                                   # (n,) int64 >= 0
    values: dict[str, np.ndarray] = field(default_factory=dict)   # field -> (n,) float64
    present: dict[str, np.ndarray] = field(default_factory=dict)  # field -> (n,) bool
    host_names: list[str] = field(default_factory=list)           # distinct hosts in the batch
    host_index: np.ndarray | None = None                # (n,) int32 into host_names, -1 = absent
    labels: dict[str, tuple[list[str], np.ndarray]] = field(default_factory=dict)  # field -> (names, index)

    def __len__(self) -> int:
        return len(self.steps)

    @computed_once
    def partial_fields(self) -> frozenset[str]:
        """The metric fields with at least one record that did not report them. The parser,
        which knows, sets it as it builds the batch (``healthsvc.ingest.parse``); otherwise it
        is read from ``present`` once. A batch is not changed after it is built.

        >>> MetricBatch(np.array([0, 1]), np.array([0, 0]), {"loss": np.array([1.0, 2.0])},
        ...             {"loss": np.array([True, False])}).partial_fields
        frozenset({'loss'})
        """
        return frozenset(f for f, p in self.present.items() if not p.all())

    @computed_once
    def n_points(self) -> int:
        """Reported metric values (NaN included, missing excluded). Counted once: the store and
        the ingest counters both ask. Only the partial fields are counted value by value."""
        partial = self.partial_fields
        return int(len(self) * (len(self.present) - len(partial))
                   + sum(np.count_nonzero(self.present[f]) for f in partial)
                   + sum(np.count_nonzero(idx >= 0) for _, idx in self.labels.values()))

    @computed_once
    def step_bounds(self) -> tuple[int, int]:
        """(smallest, largest) step of a batch with records: the store, the run state and the
        chunk's row each ask.

        >>> MetricBatch(np.array([7, 5, 6]), np.array([0, 1, 2])).step_bounds
        (5, 7)
        """
        steps = self.steps
        if len(steps) == 1:
            step = int(steps[0])
            return step, step
        return int(steps.min()), int(steps.max())

    def take(self, mask_or_index: np.ndarray) -> "MetricBatch":
        hi = None if self.host_index is None else self.host_index[mask_or_index]
        return MetricBatch(
            steps=self.steps[mask_or_index], ranks=self.ranks[mask_or_index],
            values={f: v[mask_or_index] for f, v in self.values.items()},
            present={f: p[mask_or_index] for f, p in self.present.items()},
            host_names=self.host_names, host_index=hi,
            labels={f: (names, idx[mask_or_index]) for f, (names, idx) in self.labels.items()},
        )

    @classmethod
    def concat(cls, batches: list["MetricBatch"], without: frozenset[str] = frozenset(),
               only: frozenset[str] | None = None) -> "MetricBatch":
        """The records of ``batches`` in order as one batch: a field one of them lacks is not
        reported there; host and label names are merged (indices remapped). String fields named
        in ``without`` are left out (merging names costs a Python step per push). ``only``: just
        these metric fields, and no string field (what a reader of a few numeric columns needs,
        without a trimmed copy of every batch first)."""
        if len(batches) == 1 and not without and only is None:
            return batches[0]
        fields = dict.fromkeys(f for b in batches for f in b.values if only is None or f in only)
        values = {f: np.concatenate([b.values[f] if f in b.values else np.full(len(b), np.nan) for b in batches])
                  for f in fields}
        present = {f: _concat_present(batches, f) for f in fields}
        host_names: list[str] = []
        host_index: np.ndarray | None = None
        if only is None and any(b.host_index is not None for b in batches):
            host_names, host_index = _merge_names([(b.host_names, b.host_index, len(b)) for b in batches])
        labels = {} if only is not None else \
            {f: _merge_names([(*b.labels[f], len(b)) if f in b.labels else ([], None, len(b)) for b in batches])
             for f in dict.fromkeys(f for b in batches for f in b.labels if f not in without)}
        return cls(np.concatenate([b.steps for b in batches]), np.concatenate([b.ranks for b in batches]),
                   values, present, host_names, host_index, labels)

    def with_codes(self, names: Iterable[str], numbers_only: bool = False) -> "MetricBatch":
        """The batch with each string field of ``names`` that it has added as a numeric column of
        codes (:func:`label_code`; not reported where the string was not), so that code that
        sees numbers only (the aligner, the detectors, the rollback's history) can compare the
        strings across ranks (the replicas' ``param_digest``). ``numbers_only``: without any
        string field, the host's included (a reader of numbers, who would otherwise pay for a
        Python object a record to carry them through ``healthsvc.history``).

        >>> b = MetricBatch(np.array([7, 7]), np.array([0, 1]),
        ...                 labels={"param_digest": (["a1"], np.array([0, -1], np.int32))})
        >>> c = b.with_codes(["param_digest"], numbers_only=True)
        >>> c.present["param_digest"].tolist(), bool(c.values["param_digest"][0] == label_code("a1")), c.labels
        ([True, False], True, {})
        """
        coded = [name for name in names if name in self.labels]
        if not coded and not numbers_only:
            return self
        values, present = dict(self.values), dict(self.present)
        for name in coded:
            label_names, index = self.labels[name]
            codes = np.array([label_code(n) for n in label_names] + [np.nan])   # distinct names only
            values[name], present[name] = codes[index], index >= 0
        if numbers_only:
            return MetricBatch(steps=self.steps, ranks=self.ranks, values=values, present=present)
        return MetricBatch(steps=self.steps, ranks=self.ranks, values=values, present=present,
                           host_names=self.host_names, host_index=self.host_index, labels=self.labels)

    def label_column(self, name: str) -> list[str | None]:
        """A string field as one value per record (None where not reported)."""
        names, idx = self.labels[name]
        return np.array(names + [None], dtype=object)[idx].tolist()

    def hosts_by_rank(self) -> dict[int, str]:
        """The last host each rank reported in this batch."""
        if self.host_index is None:
            return {}
        ok = self.host_index >= 0
        return {int(r): self.host_names[int(h)] for r, h in zip(self.ranks[ok], self.host_index[ok])}


def label_code(text: str) -> float:
    """A string field value as a number: 53 bits of its hash, exact in float64 (equal strings,
    equal codes; a collision has odds of 2**-53)."""
    return float(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 11)


def _merge_names(parts: list[tuple[list[str], np.ndarray | None, int]]) -> tuple[list[str], np.ndarray]:
    """(names, index, length) of several string columns (index None: not reported) -> one
    column over the union of the names; -1 stays "not reported"."""
    names: dict[str, int] = {}
    columns = []
    for part_names, index, n in parts:
        if index is None:
            columns.append(np.full(n, -1, np.int32))
            continue
        # The last entry maps -1 (not reported) to itself.
        remap = np.array([names.setdefault(name, len(names)) for name in part_names] + [-1], np.int32)
        columns.append(remap[index])
    return list(names), np.concatenate(columns)


_ALL_PRESENT = np.ones(1 << 16, dtype=bool)
_ALL_PRESENT.flags.writeable = False


def all_present(n: int) -> np.ndarray:
    """A fresh all-true mask of ``n`` records: a copy of a slice of one made once (a fifth of
    what ``np.ones`` costs, a Python function; the parser makes six a push)."""
    return _ALL_PRESENT[:n].copy() if n <= len(_ALL_PRESENT) else np.ones(n, dtype=bool)


def _concat_present(batches: list[MetricBatch], f: str) -> np.ndarray:
    """``present[f]`` of the batches' records in order, False where a batch lacks ``f``. A field
    every batch reported for every record (what the parser says in ``partial_fields``) is one
    fresh all-true mask, not a join of one mask a batch."""
    n = 0
    for b in batches:
        if f not in b.present or f in b.partial_fields:
            return np.concatenate([b.present[f] if f in b.present else np.zeros(len(b), bool) for b in batches])
        n += len(b)
    return all_present(n)
