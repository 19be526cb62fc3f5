"""Which of a run's chunks its monitor was fed: the owner's bookkeeping, by who writes the chunks.

A chunk may reach a run's monitor twice: with the push that stored it and again from the store
(the replay of a restore, a pull on a tick, a chunk a notification announced). The monitor hub
asks :meth:`FedChunks.seen` before feeding one. How that is told depends on who writes:

- :class:`InOrder` (one process): chunk ids commit in order, so the monitor's watermark (the
  newest chunk it was fed) says it all; nothing is kept.
- :class:`RecentIds` (replicas): each replica has its own writer, so a run's chunk may commit
  after one with a higher id: the ids fed lately are kept, above a floor (the restore's snapshot
  watermark, raised as old ids are forgotten) below which every chunk counts as fed.

The ownership gives the hub its kind (:meth:`~healthsvc.ownership.RunOwnership.fed_chunks`).
"""
from __future__ import annotations

from typing import Protocol


class FedChunks(Protocol):
    def seen(self, run_id: str, watermark: int, chunk_id: int) -> bool:
        """Whether the chunk was fed already (``watermark``: the monitor's); records it as fed
        otherwise."""
        ...

    def restart(self, run_id: str, floor: int) -> None:
        """The run's monitor was just restored from a snapshot at ``floor``."""
        ...

    def floor(self, run_id: str, watermark: int) -> int:
        """The chunk id after which a pull reads the run's chunks."""
        ...

    def forget(self, run_id: str) -> None:
        """The run's monitor is gone from this process."""
        ...

    def __len__(self) -> int:
        """Runs with bookkeeping kept (the memory test counts them)."""
        ...


class InOrder:
    """One writer: the monitor's watermark is the bookkeeping."""

    def seen(self, run_id: str, watermark: int, chunk_id: int) -> bool:
        return chunk_id <= watermark

    def restart(self, run_id: str, floor: int) -> None:
        pass

    def floor(self, run_id: str, watermark: int) -> int:
        return watermark

    def forget(self, run_id: str) -> None:
        pass

    def __len__(self) -> int:
        return 0


class RecentIds:
    """Several writers: the ids fed lately, above a floor.

    >>> fed = RecentIds(kept=4)
    >>> fed.restart("r", 10)
    >>> [fed.seen("r", 0, c) for c in (9, 12, 11, 12)]
    [True, False, False, True]
    """

    def __init__(self, kept: int = 4096) -> None:
        self._fed: dict[str, dict[int, None]] = {}   # run_id -> ids fed lately, in feeding order
        self._floor: dict[str, int] = {}
        self._kept = kept

    def seen(self, run_id: str, watermark: int, chunk_id: int) -> bool:
        fed = self._fed.setdefault(run_id, {})
        if chunk_id <= self._floor.get(run_id, 0) or chunk_id in fed:
            return True
        fed[chunk_id] = None
        if len(fed) > self._kept:
            old = sorted(fed)[: len(fed) - self._kept // 2]
            for c in old:
                del fed[c]
            self._floor[run_id] = max(self._floor.get(run_id, 0), old[-1])
        return False

    def restart(self, run_id: str, floor: int) -> None:
        self._fed.pop(run_id, None)
        self._floor[run_id] = floor

    def floor(self, run_id: str, watermark: int) -> int:
        return max(self._floor.get(run_id, 0), watermark)

    def forget(self, run_id: str) -> None:
        self._fed.pop(run_id, None)
        self._floor.pop(run_id, None)

    def __len__(self) -> int:
        return len(self._fed)
