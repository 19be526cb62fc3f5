"""The usual push alone in its group commit: on PostgreSQL its one statement (the claim of its
digest and its chunk) runs outside the writer's transaction and is committed on its own, one
round trip where BEGIN, it and COMMIT took three (``PgConnection.solo``). What the job writes
after it opens the transaction then; a job that fails after it keeps the push, and the client's
retry is answered as the duplicate it is. On SQLite the whole job is one transaction: the failed
job stores nothing and the retry stores the push. Either way the push is stored exactly once."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from healthsvc.history import load_history
from healthsvc.store.batch import MetricBatch
from healthsvc.store import ingest, snapshots
from healthsvc.store.open import open_store

pytestmark = pytest.mark.both_stores


def step(s: int) -> MetricBatch:
    """Step ``s`` of ranks 0 and 1, each rank's process named (so a retried step that lands after
    a later one fills its gap: not a restart)."""
    b = MetricBatch(steps=np.array([s, s]), ranks=np.array([0, 1]))
    b.values["loss"] = np.array([1.0 + s, 2.0 + s])
    b.present["loss"] = np.array([True, True])
    b.labels["incarnation"] = (["p0", "p1"], np.array([0, 1], np.int32))
    return b


@pytest.fixture
def store(db_uri):
    s = open_store(db_uri, snapshot_every_s=3600.0)
    s.open()
    yield s
    s.close()


def test_a_push_whose_job_fails_after_its_append_is_stored_once_after_the_retry(store, db_uri, monkeypatch):
    assert store.ingest.submit_metrics("r", step(0), "d0").result(10).attempt == 1   # the run's first push
    applied = type(store.ingest)._applied

    def fails_after_the_append(self, *args, **kwargs):
        monkeypatch.setattr(type(store.ingest), "_applied", applied)   # once
        raise RuntimeError("the job fails after its append")
    monkeypatch.setattr(type(store.ingest), "_applied", fails_after_the_append)
    with pytest.raises(RuntimeError, match="after its append"):
        store.ingest.submit_metrics("r", step(1), "d1").result(10)
    again = store.ingest.submit_metrics("r", step(1), "d1").result(10)   # the client retries
    # PostgreSQL: the append committed on its own; SQLite: the failed job stored nothing.
    assert again.duplicate is db_uri.startswith("postgresql://")
    assert store.ingest.submit_metrics("r", step(2), "d2").result(10).duplicate is False
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
            stored = store.ingest.submit_metrics("r", step(s), f"d{s}").result(10)
            assert not stored.duplicate
            snap = snapshots.read_snapshots(store.read_conn(), "ingest", "r")["r"]
            assert snap.watermark == stored.chunk_id
        store.ingest.submit_metrics("r", step(3), "d3").result(10)   # a duplicate: the connection is fit
        assert store.ingest.submit_metrics("r", step(4), "d4").result(10).chunk_id > stored.chunk_id
    finally:
        store.close()
    reopened = open_store(db_uri)
    reopened.open()
    try:
        assert reopened.reads.run_state("r").view().attempt == 1
        assert load_history(reopened, "r").steps.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    finally:
        reopened.close()


def new_rank(s: int) -> MetricBatch:
    """Step ``s`` of rank 2, new to the run: a push the general way (not only an append), whose
    job takes its savepoint before its first statement."""
    b = MetricBatch(steps=np.array([s]), ranks=np.array([2]))
    b.values["loss"] = np.array([3.0 + s])
    b.present["loss"] = np.array([True])
    b.labels["incarnation"] = (["p2"], np.array([0], np.int32))
    return b


class HeldWriter:
    """Holds the store's writer in a job until released: what is submitted meanwhile runs as
    one group commit."""

    def __init__(self, store) -> None:
        self.gate, held = threading.Event(), threading.Event()

        def hold(conn):
            held.set()
            assert self.gate.wait(10)
        self.first = store.write(hold)
        assert held.wait(10)

    def release(self) -> None:
        self.gate.set()
        self.first.result(10)


def test_pushes_of_one_group_commit_are_stored_once_each_when_one_fails_after_its_append(store, db_uri,
                                                                                         monkeypatch):
    # On PostgreSQL a push after others in its group appends without a savepoint before it
    # (PgConnection.solo): its failure after the append keeps the append and must not undo the
    # pushes before it; the push after it takes its own savepoint.
    store.ingest.submit_metrics("r", step(0), "d0").result(10)
    applied = type(store.ingest)._applied

    def fails_after_the_append(self, conn, run_id, st, batch, *args, **kwargs):
        if int(batch.steps[0]) == 2:
            raise RuntimeError("the job fails after its append")
        return applied(self, conn, run_id, st, batch, *args, **kwargs)
    monkeypatch.setattr(type(store.ingest), "_applied", fails_after_the_append)
    held = HeldWriter(store)
    futures = {s: store.ingest.submit_metrics("r", step(s), f"d{s}") for s in (1, 2)}
    futures["new rank"] = store.ingest.submit_metrics("r", new_rank(3), "n3")   # right after the failed job
    futures[3] = store.ingest.submit_metrics("r", step(3), "d3")
    held.release()
    assert not futures[1].result(10).duplicate and not futures[3].result(10).duplicate
    assert not futures["new rank"].result(10).duplicate
    with pytest.raises(RuntimeError, match="after its append"):
        futures[2].result(10)
    monkeypatch.setattr(type(store.ingest), "_applied", applied)
    again = store.ingest.submit_metrics("r", step(2), "d2").result(10)   # the client retries
    assert again.duplicate is db_uri.startswith("postgresql://")
    h = load_history(store, "r")
    assert sorted(zip(h.steps.tolist(), h.ranks.tolist(), h.values["loss"].tolist())) == \
        sorted([(s, r, 1.0 + r + s) for s in range(4) for r in range(2)] + [(3, 2, 6.0)])
    assert not store.writes_failing


def test_what_a_push_writes_after_its_append_in_a_group_rolls_back_alone_when_it_fails(db_uri, monkeypatch):
    # A snapshot due at every push is written after the append: for a push after others in its
    # group, under the savepoint taken after its append. The push whose snapshot fails loses the
    # snapshot, not its append, nor the pushes before and after it.
    store = open_store(db_uri, snapshot_every_s=0.0)
    store.open()
    try:
        store.ingest.submit_metrics("r", step(0), "d0").result(10)
        write_snapshot = type(store.ingest)._write_snapshot

        def fails_after_writing(self, conn, run_id, st):
            write_snapshot(self, conn, run_id, st)
            if st.max_step() == 2:
                raise RuntimeError("the snapshot fails after its write")
        monkeypatch.setattr(type(store.ingest), "_write_snapshot", fails_after_writing)
        held = HeldWriter(store)
        futures = {s: store.ingest.submit_metrics("r", step(s), f"d{s}") for s in (1, 2, 3)}
        held.release()
        with pytest.raises(RuntimeError, match="after its write"):
            futures[2].result(10)
        last = futures[3].result(10)
        monkeypatch.setattr(type(store.ingest), "_write_snapshot", write_snapshot)
        snap = snapshots.read_snapshots(store.read_conn(), "ingest", "r")["r"]
        assert snap.watermark == last.chunk_id     # the last push's snapshot, after the failed one
        postgres = db_uri.startswith("postgresql://")
        assert store.ingest.submit_metrics("r", step(2), "d2").result(10).duplicate is postgres
    finally:
        store.close()
    reopened = open_store(db_uri)
    reopened.open()
    try:
        assert load_history(reopened, "r").steps.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    finally:
        reopened.close()


def test_a_push_whose_append_fails_in_a_group_fails_the_group_and_every_retry_stores_once(store, monkeypatch):
    # An append the database refuses aborts the group's transaction on PostgreSQL, where no
    # savepoint guards the pushes before it: the whole group must fail (none of it
    # acknowledged), so the clients' retries store every push once. On SQLite the failed job
    # rolls back alone.
    store.ingest.submit_metrics("r", step(0), "d0").result(10)

    chunk_row = ingest.chunk_row

    def refused_row(run_id, attempt, batch, now, payload):
        row = chunk_row(run_id, attempt, batch, now, payload)
        return (*row[:4], 2 ** 64, *row[5:]) if int(batch.steps[0]) == 2 else row   # n_records too big
    for module in [m for m in list(sys.modules.values()) if getattr(m, "chunk_row", None) is chunk_row]:
        monkeypatch.setattr(module, "chunk_row", refused_row)
    # The refused push follows one that went the general way: the savepoint that push took must
    # not be what the failure rolls back to (that push would be acknowledged, yet lost).
    pushes = {"d1": step(1), "n1": new_rank(1), "d2": step(2), "d3": step(3)}
    held = HeldWriter(store)
    futures = {digest: store.ingest.submit_metrics("r", batch, digest) for digest, batch in pushes.items()}
    held.release()
    acknowledged = set()
    for digest, fut in futures.items():
        try:
            assert not fut.result(10).duplicate
            acknowledged.add(digest)
        except Exception:  # noqa: BLE001 - the client is told to retry
            pass
    assert "d2" not in acknowledged and acknowledged <= {"d1", "n1", "d3"}
    # SQLite: the refused job rolls back alone; PostgreSQL: the group fails.
    assert acknowledged == (set() if type(store).__name__ == "PostgresStore" else {"d1", "n1", "d3"})
    monkeypatch.undo()
    for digest, batch in pushes.items():   # every client retries what was not acknowledged
        assert store.ingest.submit_metrics("r", batch, digest).result(10).duplicate is (digest in acknowledged)
    h = load_history(store, "r")
    assert sorted(zip(h.steps.tolist(), h.ranks.tolist())) == \
        sorted([(s, r) for s in range(4) for r in range(2)] + [(1, 2)])
    assert not store.writes_failing
