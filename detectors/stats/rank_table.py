"""Per-rank state arrays keyed by rank id: ranks may appear at any time; a rank missing from a
block keeps its state untouched."""
from __future__ import annotations

from typing import Any

import numpy as np

from healthsvc_detectors.stats.state_json import array_from_json, array_to_json


class RankTable:
    """Per-rank state arrays keyed by rank id.

    ``fields`` maps a name to its default value (its dtype follows the default). ``positions``
    returns, for the columns of a block, the rows of the state arrays, adding unknown ranks with
    default state. Ranks never seen again keep their state.

    >>> t = RankTable({"count": 0})
    >>> t.positions(np.array([3, 1])).tolist()
    [1, 0]
    >>> t.positions(np.array([2])).tolist(), t.ids.tolist()
    ([1], [1, 2, 3])
    """

    def __init__(self, fields: dict[str, Any]) -> None:
        self.defaults = dict(fields)
        self.ids = np.zeros(0, dtype=np.int64)
        self.arrays = {k: np.zeros(0, dtype=np.asarray(v).dtype) for k, v in fields.items()}
        self._cache_key: bytes | None = None
        self._cache_pos: np.ndarray | None = None
        self._cache_index: np.ndarray | slice | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def positions(self, ranks: np.ndarray) -> np.ndarray:
        key = ranks.tobytes()
        if key == self._cache_key and self._cache_pos is not None:
            return self._cache_pos
        new = np.setdiff1d(ranks, self.ids)
        if len(new):
            at = np.searchsorted(self.ids, new)
            self.ids = np.insert(self.ids, at, new)
            for k, arr in self.arrays.items():
                self.arrays[k] = np.insert(arr, at, self.defaults[k])
        pos = np.searchsorted(self.ids, ranks)
        self._cache_key, self._cache_pos = key, pos
        # Every known rank in order (the usual block): a slice, whose reads are views and whose
        # writes go straight into the arrays instead of a gather and a scatter.
        ordered = len(pos) == len(self.ids) and bool((pos == np.arange(len(pos))).all())
        self._cache_index = slice(None) if ordered else pos
        return pos

    def index(self, ranks: np.ndarray) -> np.ndarray | slice:
        """:meth:`positions`, or ``slice(None)`` when they are every row in order (reads through
        it are views, not copies).

        >>> t = RankTable({"count": 0})
        >>> t.index(np.array([1, 2])), t.index(np.array([2])).tolist()
        (slice(None, None, None), [1])
        """
        self.positions(ranks)
        assert self._cache_index is not None
        return self._cache_index

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.arrays[name] = value

    def state_dict(self) -> dict[str, Any]:
        return {"ids": self.ids.tolist(), **{k: array_to_json(a) for k, a in self.arrays.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ids = np.asarray(state["ids"], dtype=np.int64)
        for k, default in self.defaults.items():
            dtype = np.asarray(default).dtype
            # A field added since the state was saved starts at its default for every rank.
            self.arrays[k] = (array_from_json(state[k], dtype) if k in state
                              else np.full(len(self.ids), default, dtype=dtype))
        self._cache_key, self._cache_pos, self._cache_index = None, None, None
