"""Waiting for a store write, bounded: a database that stops answering (a frozen network, a hung
disk) makes a write's request a 503 after ``WRITE_WAIT_S``, not a request that hangs as long as
the store's writer does.

The write is not withdrawn: it may still commit once the database answers, which the 503 says.
A push retried after it is stored once (the store deduplicates a batch by its digest).
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from healthsvc.errors import StoreUnavailable

# Under the usual client timeouts (the push client's is longer), well over a group commit's time.
WRITE_WAIT_S = 10.0


async def committed(write: Future, wait_s: float = WRITE_WAIT_S) -> Any:
    """The result of the store's ``write`` once committed; StoreUnavailable after ``wait_s`` s.

    Every push waits here, so it is one asyncio future woken from the writer thread and one
    timer: ``asyncio.wait_for(asyncio.shield(asyncio.wrap_future(write)))`` makes a task and two
    chained futures, and cost 25 µs of CPU a call against 15 µs for this (uvloop, 8 concurrent)."""
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def wake(_: Any = None) -> None:
        if not woken.done():
            woken.set_result(None)

    def wake_soon(_: Future) -> None:   # on the writer thread
        if not loop.is_closed():
            loop.call_soon_threadsafe(wake)

    write.add_done_callback(wake_soon)
    timer = loop.call_later(wait_s, wake)
    try:
        await woken
    finally:
        timer.cancel()
    if not write.done():
        raise not_committed(write, wait_s) from None
    return write.result()


def not_committed(write: Future, wait_s: float) -> StoreUnavailable:
    """The 503 of a ``write`` the store has not committed within ``wait_s``. The write is not
    withdrawn: whatever it ends with later is nobody's to hear, and is marked so (an exception
    nobody retrieved would be logged as unheard)."""
    write.add_done_callback(lambda f: f.cancelled() or f.exception())
    return StoreUnavailable(f"the store has not committed the write within {wait_s:.0f} s", loc=(),
                            hint="the database does not answer; the write may still be applied once it does, "
                                 "and a push sent again is stored once")
