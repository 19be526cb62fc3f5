"""The service clock: unix seconds that never step.

Every timeout, retry, interval and window in the service (hang and stall timeouts, the ticker,
aligner waits, webhook backoff, dedupe windows, silences, group intervals) is measured on this
clock: the wall time read once at start, advanced by ``time.monotonic()``. A step of the system
clock while the service runs (NTP correcting a bad clock, an operator's ``date -s``) moves neither
a timeout nor a retry: +90 s raises no false stall, -1 h does not delay a hang by an hour.

Timestamps it gives are also what the service stores and shows (``created_at``, ``ts``, alert
times), so they can differ from the wall clock by the steps taken since the start; each start
re-reads the wall clock, and never starts before the newest time the store holds
(:meth:`ServiceClock.not_before`): stored times are compared with this clock after a restart, and
a wall clock that came back behind them (an hour behind: a stall found an hour late) would
otherwise delay every timeout by the difference. Webhook signatures (checked by receivers against their own clock) use
the wall clock itself, via :meth:`ServiceClock.wall`.

    >>> ticks = iter([100.0, 101.5])
    >>> clock = ServiceClock(wall=lambda: 1_700_000_000.0, mono=lambda: next(ticks))
    >>> clock()   # the wall clock may step from here on; this clock only advances with monotonic
    1700000001.5
"""
from __future__ import annotations

import time
from typing import Callable


class ServiceClock:
    def __init__(self, wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic) -> None:
        self._wall = wall
        self._mono = mono
        self._offset = wall() - mono()

    def __call__(self) -> float:
        return self._offset + self._mono()

    def not_before(self, t: float) -> float:
        """Move this clock forward so that it reads at least ``t`` now (the newest time stored
        before a restart); returns the seconds it moved (0 when it was past ``t`` already).

        >>> clock = ServiceClock(wall=lambda: 100.0, mono=lambda: 0.0)
        >>> clock.not_before(160.0), clock(), clock.not_before(120.0)
        (60.0, 160.0, 0.0)
        """
        shift = t - self()
        if shift <= 0:
            return 0.0
        self._offset += shift
        return shift

    def wall(self) -> float:
        """The system's wall clock now (for what other machines compare with theirs)."""
        return self._wall()

    def __repr__(self) -> str:
        return f"ServiceClock(now={self():.3f}, wall={self._wall():.3f})"
