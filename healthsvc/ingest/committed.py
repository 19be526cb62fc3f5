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
    """The result of the store's ``write`` once committed; StoreUnavailable after ``wait_s`` s."""
    pending = asyncio.wrap_future(write)
    try:
        return await asyncio.wait_for(asyncio.shield(pending), wait_s)
    except asyncio.TimeoutError:
        # Whatever it ends with later is nobody's to hear (and must not be logged as unheard).
        pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise StoreUnavailable(f"the store has not committed the write within {wait_s:.0f} s", loc=(),
                               hint="the database does not answer; the write may still be applied once it does, "
                                    "and a push sent again is stored once") from None
