"""Each notification is claimed by one worker: two stores on one database (two replicas) claim
concurrently and are never handed the same row; a released or expired claim is due again."""
from __future__ import annotations

import threading

import pytest

from healthsvc.store.open import open_store
from healthsvc.store.outbox import Outbox

pytestmark = pytest.mark.both_stores


def test_concurrent_claimers_split_the_due_rows_and_each_row_goes_once(db_uri):
    stores = [open_store(db_uri), open_store(db_uri)]
    for s in stores:
        s.open()
    try:
        a, b = (Outbox(s) for s in stores)
        ids = {a.enqueue("sub", "http://127.0.0.1:1/hook", "", b"{}", now=100.0 + i) for i in range(200)}
        got: list[list[str]] = [[], []]
        start, both_hold_rows = threading.Barrier(2), threading.Barrier(2)

        def claimer(i: int, outbox: Outbox) -> None:
            start.wait()
            claimed = outbox.claim(now=1000.0, limit=7, hold_s=30.0)
            # Both hold rows before either goes on: on SQLite one thread can otherwise drain all
            # 200 before the other is scheduled, and the split below would not be tested.
            both_hold_rows.wait()
            while claimed:
                got[i].extend(d.webhook_id for d in claimed)
                claimed = outbox.claim(now=1000.0, limit=7, hold_s=30.0)

        threads = [threading.Thread(target=claimer, args=(i, o)) for i, o in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not set(got[0]) & set(got[1])               # no row handed to both
        assert sorted(got[0] + got[1]) == sorted(ids)     # and every row to one
        assert a.due(now=1000.0) == []                     # claimed rows are not due ...
        assert len(a.due(now=1030.0, limit=1000)) == 200   # ... until the claim runs out
        wid = got[1][0]
        b.record_attempt(wid, 1001.0, state="pending", status=503, error="busy", next_attempt_at=1002.0)
        assert [d.webhook_id for d in a.claim(now=1002.0, limit=1)] == [wid]   # released: due again
    finally:
        for s in stores:
            s.close()
