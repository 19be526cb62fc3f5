"""A large read leaves no large buffer behind (issue 25's soak: memory flat after warm-up).
libpq keeps a connection's input buffer as large as the largest message it ever received, in
malloc memory Python does not see: each pooled connection that once read a large snapshot kept
it (one 8 MiB row: 32 MiB) for the connection's life. The store closes a connection that read a
large row instead of pooling it. Measured with glibc's ``mallinfo2``: malloc memory in use."""
from __future__ import annotations

import gc
import os
import threading

import pytest

from healthsvc.ops import allocator
from healthsvc.store.postgres import PostgresStore
from tests.pg import fresh_database

pytestmark = pytest.mark.skipif(not allocator.available(), reason="glibc malloc only")

READERS = 6


def in_use() -> int:
    gc.collect()
    held, free = allocator.heap()
    return held - free


def test_reading_a_large_snapshot_on_every_pooled_connection_keeps_no_buffer():
    blob = os.urandom(4 << 20)   # a large run's detector state: 8 MiB of hex on the wire
    with fresh_database() as uri:
        store = PostgresStore(uri)
        store.open()
        try:
            store.save_snapshot("big", "monitor", 1, blob).result(30)
            before = in_use()
            # Readers at once, so the reads borrow different pooled connections; the barrier
            # holds each until all have read (each keeps its connection meanwhile).
            barrier = threading.Barrier(READERS)

            def read() -> None:
                with store._pool.connection():     # one connection held by each reader...
                    barrier.wait(30)
                assert store.snapshot("big", "monitor").state == blob   # ...then the snapshot read

            threads = [threading.Thread(target=read) for _ in range(READERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            for _ in range(3 * READERS):     # and again, on whichever connections the pool gives
                assert store.snapshot("big", "monitor").state == blob
            grown = in_use() - before
        finally:
            store.close()
    # Without the fix: 16 MiB per connection that read it (at least 3 of them: 48 MiB and more).
    assert grown < 24 << 20, f"malloc in use grew by {grown / 2**20:.1f} MiB"
