"""The usual push alone in its group commit: on PostgreSQL its one statement (the claim of its
digest and its chunk) runs outside the writer's transaction and is committed on its own, one
round trip where BEGIN, it and COMMIT took three (``PgConnection.solo``). What the job writes
after it opens the transaction then; a job that fails after it keeps the push, and the client's
retry is answered as the duplicate it is. On SQLite the whole job is one transaction: the failed
job stores nothing and the retry stores the push. Either way the push is stored exactly once."""
from __future__ import annotations

import numpy as np
import pytest

from healthsvc.history import load_history
from healthsvc.ingest.batch import MetricBatch
from healthsvc.store import snapshots
from healthsvc.store.open import open_store

pytestmark = pytest.mark.both_stores


def step(s: int) -> MetricBatch:
    b = MetricBatch(steps=np.array([s, s]), ranks=np.array([0, 1]))
    b.values["loss"] = np.array([1.0 + s, 2.0 + s])
    b.present["loss"] = np.array([True, True])
    return b


@pytest.fixture
def store(db_uri):
    s = open_store(db_uri, snapshot_every_s=3600.0)
    s.open()
    yield s
    s.close()


def test_a_push_whose_job_fails_after_its_append_is_stored_once_after_the_retry(store, db_uri, monkeypatch):
    assert store.submit_metrics("r", step(0), "d0").result(10).attempt == 1   # the run's first push
    applied = type(store)._applied

    def fails_after_the_append(self, *args, **kwargs):
        monkeypatch.setattr(type(store), "_applied", applied)   # once
        raise RuntimeError("the job fails after its append")
    monkeypatch.setattr(type(store), "_applied", fails_after_the_append)
    with pytest.raises(RuntimeError, match="after its append"):
        store.submit_metrics("r", step(1), "d1").result(10)
    again = store.submit_metrics("r", step(1), "d1").result(10)   # the client retries
    # PostgreSQL: the append committed on its own; SQLite: the failed job stored nothing.
    assert again.duplicate is db_uri.startswith("postgresql://")
    assert store.submit_metrics("r", step(2), "d2").result(10).duplicate is False
    h = load_history(store, "r")
    assert sorted(zip(h.steps.tolist(), h.ranks.tolist(), h.values["loss"].tolist())) == \
        [(s, r, 1.0 + r + s) for s in range(3) for r in range(2)]


def test_what_a_lone_push_writes_after_its_append_commits_with_the_job(db_uri):
    # A snapshot due at every push: written after the append, in the transaction the append
    # left to the rest of the job (on PostgreSQL, begun after the append committed).
    store = open_store(db_uri, snapshot_every_s=0.0)
    store.open()
    try:
        for s in range(4):
            stored = store.submit_metrics("r", step(s), f"d{s}").result(10)
            assert not stored.duplicate
            snap = snapshots.read_snapshots(store.read_conn(), "ingest", "r")["r"]
            assert snap.watermark == stored.chunk_id
        store.submit_metrics("r", step(3), "d3").result(10)   # a duplicate: the connection is fit
        assert store.submit_metrics("r", step(4), "d4").result(10).chunk_id > stored.chunk_id
    finally:
        store.close()
    reopened = open_store(db_uri)
    reopened.open()
    try:
        assert reopened.run_state("r").view().attempt == 1
        assert load_history(reopened, "r").steps.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    finally:
        reopened.close()
