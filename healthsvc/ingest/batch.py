"""A validated batch of per-rank step records, held as columns.

``values[f]`` is float64; ``present[f]`` is False where the field was null or absent ("not
reported"). A NaN or infinity with ``present`` True is a real reported value: NaN is data.

String fields: ``host`` is held as ``host_names``/``host_index``; every other string field (such as
``param_digest``) as ``labels[f] = (names, index)``, ``index`` an int32 column into ``names`` with
-1 where the field was not reported.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np


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

    @functools.cached_property
    def n_points(self) -> int:
        """Reported metric values (NaN included, missing excluded). Counted once: the store and
        the ingest counters both ask."""
        return (int(sum(int(p.sum()) for p in self.present.values()))
                + int(sum(int((idx >= 0).sum()) for _, idx in self.labels.values())))

    def take(self, mask_or_index: np.ndarray) -> "MetricBatch":
        hi = None if self.host_index is None else self.host_index[mask_or_index]
        return MetricBatch(
            steps=self.steps[mask_or_index], ranks=self.ranks[mask_or_index],
            values={f: v[mask_or_index] for f, v in self.values.items()},
            present={f: p[mask_or_index] for f, p in self.present.items()},
            host_names=self.host_names, host_index=hi,
            labels={f: (names, idx[mask_or_index]) for f, (names, idx) in self.labels.items()},
        )

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
