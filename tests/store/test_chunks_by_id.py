"""Reading chunks by id: what the owner of a run does for each notification of pushes accepted by
another replica. Exactly the run's chunks among the ids, oldest first, whole (no stream on
PostgreSQL), however many ids a notification folded together."""
from __future__ import annotations

import numpy as np
import pytest

from healthsvc.store.batch import MetricBatch
from healthsvc.store import snapshots
from healthsvc.store.open import open_store

pytestmark = pytest.mark.both_stores


def _push(store, run_id: str, step: int) -> int:
    b = MetricBatch(steps=np.array([step]), ranks=np.array([0]))
    b.values["loss"] = np.array([float(step)])
    b.present["loss"] = np.array([True])
    return store.ingest.submit_metrics(run_id, b, f"{run_id}-{step}").result(10).chunk_id


def test_chunks_by_id_reads_exactly_the_runs_named_chunks_oldest_first(db_uri):
    store = open_store(db_uri)
    store.open()
    try:
        mine = [_push(store, "a", s) for s in range(snapshots.BY_ID_LIMIT + 10)]
        other = [_push(store, "b", s) for s in range(3)]
        wanted = [mine[5], mine[2], *mine[20:], other[0], max(mine + other) + 100, mine[2]]
        got = list(store.chunks_by_id("a", wanted))
        assert [c.id for c in got] == sorted({mine[5], mine[2], *mine[20:]})
        assert [float(c.batch.values["loss"][0]) for c in got] == [2.0, 5.0, *map(float, range(20, len(mine)))]
        assert list(store.chunks_by_id("a", [])) == []
        # A chunk read fetched at once (how chunks_by_id reads; on PostgreSQL one plain statement)
        # gives the rows the streamed read gives.
        sql, args = "SELECT id, attempt, received_at, payload FROM chunks WHERE run_id=? AND id>? ORDER BY id", ("a", mine[3])
        at_once = store.read_conn().execute(sql, args).fetchall()
        streamed = list(store.read_conn().execute(sql, args))
        assert [r[0] for r in at_once] == mine[4:] and [tuple(r) for r in at_once] == [tuple(r) for r in streamed]
    finally:
        store.close()
