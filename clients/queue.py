"""A bounded queue that never blocks its producer: when full, the oldest item is dropped and counted.

Training comes first: a slow or absent service must cost the training thread neither time nor
memory, so the newest data wins and the loss is visible in ``dropped``. Built on
``collections.deque(maxlen=...)`` whose ``append``/``popleft`` are atomic under the GIL, so ``put``
takes no lock (it is on the training thread's hot path).

Example::

    >>> q = DropOldestQueue(2)
    >>> for i in range(3):
    ...     q.put(i)
    >>> q.drain(), q.dropped
    ([1, 2], 1)
"""
from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class DropOldestQueue(Generic[T]):
    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._items: deque[T] = deque(maxlen=maxsize)
        # Counted by the producer only; with several producer threads the count can be off by the
        # few items raced at the boundary, which is acceptable for a statistic.
        self.dropped = 0
        # Items ever put (by the producer) and ever taken out (drained or cleared, by the
        # consumer): ``taken + dropped`` items have left the front, so the item put when
        # ``puts`` was n is still queued while ``taken + dropped < n`` (a position the sender
        # orders control requests by; off by the same raced few when the queue is full).
        self.puts = 0
        self.taken = 0

    def __repr__(self) -> str:
        return f"DropOldestQueue({len(self._items)}/{self.maxsize}, dropped={self.dropped})"

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        items = self._items
        if len(items) == self.maxsize:
            self.dropped += 1
        items.append(item)  # deque(maxlen) discards the oldest itself
        self.puts += 1

    def drain(self, limit: int | None = None) -> list[T]:
        """Remove and return up to ``limit`` items (all when None), oldest first."""
        out: list[T] = []
        items = self._items
        while limit is None or len(out) < limit:
            try:
                out.append(items.popleft())
            except IndexError:
                break
        self.taken += len(out)
        return out

    def peek(self) -> T | None:
        """The oldest item, left in the queue; None when it is empty."""
        try:
            return self._items[0]
        except IndexError:
            return None

    def clear(self) -> None:
        self.taken += len(self._items)
        self._items.clear()
