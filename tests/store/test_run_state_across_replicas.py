"""A run's state is the run's, not one replica's: two stores on one PostgreSQL database (two
replicas behind a balancer) each see only the pushes they were sent.

- A restart seen by one replica is the run's restart on every replica: after the job restarts
  from a checkpoint, a replica that never saw a rank's old steps must not store that rank's
  repeated steps in the old attempt (the history would hold the step twice in one attempt).
- The run finishes when its last rank finishes, on whichever replica: not when the ranks one
  replica saw are done (the hang checks would go silent while others train), and not never.
"""
from __future__ import annotations

import numpy as np
import pytest

from healthsvc.history import load_history
from healthsvc.store.batch import MetricBatch
from healthsvc.store import snapshots
from healthsvc.store.postgres import PostgresStore
from tests.pg import fresh_database

RANKS = 4


@pytest.fixture
def replicas():
    """Two stores on one fresh PostgreSQL database: two replicas' views of it."""
    with fresh_database() as uri:
        a, b = PostgresStore(uri), PostgresStore(uri)
        a.open()
        b.open()
        try:
            yield a, b
        finally:
            a.close()
            b.close()


def record(rank: int, step: int, loss: float, process: str | None = None) -> MetricBatch:
    b = MetricBatch(steps=np.array([step]), ranks=np.array([rank]))
    b.values["loss"] = np.array([loss])
    b.present["loss"] = np.array([True])
    if process is not None:   # the client's incarnation: this rank's process
        b.labels["incarnation"] = ([f"{process}-rank{rank}"], np.zeros(1, dtype=np.int32))
    return b


def push(store: PostgresStore, rank: int, step: int, loss: float, run: str = "r", process: str | None = None) -> int:
    return store.ingest.submit_metrics(run, record(rank, step, loss, process),
                                f"{rank}-{step}-{loss}" + (f"-{process}" if process else "")).result(10).attempt


def test_a_restarted_rank_first_heard_by_a_replica_that_never_saw_it_opens_the_attempt(replicas):
    # Rank 1 pushed only through a; after the restart its first push reaches b, before any
    # replica has seen the restart. Its steps alone cannot tell b (b never saw the old ones);
    # its new incarnation, against the one the database holds for rank 1, does.
    a, b = replicas
    for step in range(10):
        assert push(a, 0, step, 1.0, process="p1") == push(a, 1, step, 1.0, process="p1") == 1
    assert push(b, 1, 10, 2.0, process="p2") == 2      # resumed from a checkpoint at step 9
    assert push(a, 0, 10, 2.0, process="p2") == 2      # a: rank 0's new incarnation joins it
    assert push(a, 1, 11, 2.0, process="p2") == 2      # a: the attempt rank 1 is in now
    assert [(x["attempt"], x["start_step"]) for x in b.reads.attempts("r")] == [(1, 0), (2, 10)]
    # A late record of rank 1's old process, through b, goes to attempt 1.
    assert push(b, 1, 12, 1.0, process="p1") == 1


def test_a_replica_joins_the_attempt_another_replica_opened(replicas):
    a, b = replicas
    # Steps 0-29, rank 0 always through a, the others alternating: b never sees rank 0.
    for step in range(30):
        for rank in range(RANKS):
            via = a if rank == 0 or (step + rank) % 2 else b
            assert push(via, rank, step, 1.0) == 1
    # The job restarts from its checkpoint at step 20. Rank 1's first push reaches a,
    # which saw rank 1 at step 21 before: a restart, attempt 2. Rank 0's reaches b, which
    # never saw rank 0: only the database tells b that the run is in attempt 2 now.
    assert push(a, 1, 21, 2.0) == 2
    assert push(b, 0, 21, 2.0) == 2
    for step in range(21, 40):
        for rank in range(RANKS):
            if step == 21 and rank in (0, 1):
                continue
            via = b if (step + rank) % 2 else a
            assert push(via, rank, step, 2.0) == 2, (step, rank)
    assert [(x["attempt"], x["start_step"]) for x in a.reads.attempts("r")] == [(1, 0), (2, 21)]
    for store in (a, b):   # both replicas answer the same history
        h = load_history(store, "r")
        got = sorted(zip(h.steps.tolist(), h.ranks.tolist(), h.attempts.tolist(), h.values["loss"].tolist()))
        want = sorted((s, r, 1 if s <= 20 else 2, 1.0 if s <= 20 else 2.0)
                      for s in range(40) for r in range(RANKS))
        assert got == want


def test_a_push_of_plain_progress_on_a_replica_behind_the_run_goes_to_the_newer_attempt(replicas):
    # The usual push (a rank the replica knows, a step beyond its last there) is stored in one
    # statement that also reads the run's newest attempt: it must not land in the old one.
    a, b = replicas
    for step in range(20):    # b sees rank 0 up to step 9, a sees the rest
        for rank in range(2):
            assert push(b if rank == 0 and step < 10 else a, rank, step, 1.0) == 1
    # Restart from step 15: a sees it (rank 0 was at 19 there) and opens attempt 2.
    assert push(a, 0, 15, 2.0) == 2
    assert push(a, 1, 15, 2.0) == 2
    # b knows rank 0 at step 9 in attempt 1: step 16 looks like plain progress there.
    assert push(b, 0, 16, 2.0) == 2
    assert push(b, 0, 17, 2.0) == 2
    # A retried push through the same path is a duplicate, stored once.
    again = b.ingest.submit_metrics("r", record(0, 17, 2.0), "0-17-2.0").result(10)
    assert again.duplicate and again.attempt == 2
    h = load_history(a, "r")
    got = sorted(zip(h.steps.tolist(), h.ranks.tolist(), h.attempts.tolist()))
    assert got == sorted([(s, r, 1) for s in range(15) for r in range(2)]
                         + [(15, 0, 2), (15, 1, 2), (16, 0, 2), (17, 0, 2)])


def test_a_replica_that_loads_a_run_while_another_stores_its_first_push_takes_the_push(replicas, monkeypatch):
    # The run exists (its config was put through a) but has no push yet. b's first push loads
    # the run's state from the database: the attempts, then the chunks. a's first push commits
    # between the two reads (on cue here; under load, by chance): b must read its attempt too.
    a, b = replicas
    a.control.submit_run_config("r", {"world_size": 2}).result(10)
    chunks_after = snapshots.chunks_after
    cue = []

    def a_push_commits_first(conn, run_id, watermark, fields=None):
        if not cue:
            cue.append(push(a, 0, 0, 1.0))
        return chunks_after(conn, run_id, watermark, fields)
    monkeypatch.setattr(snapshots, "chunks_after", a_push_commits_first)
    assert push(b, 1, 0, 1.0) == 1
    assert cue == [1]
    assert push(b, 1, 1, 1.0) == 1 and push(a, 0, 1, 1.0) == 1
    h = load_history(b, "r")
    assert sorted(zip(h.steps.tolist(), h.ranks.tolist(), h.attempts.tolist())) == \
        [(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]


def finish(store: PostgresStore, rank: int) -> str:
    return store.control.submit_finish("r", rank).result(10).kind


def test_the_run_finishes_when_its_last_rank_finishes_on_any_replica(replicas):
    a, b = replicas
    for step in range(5):   # a sees ranks 0 and 1, b sees ranks 2 and 3
        for rank in range(RANKS):
            push(a if rank < 2 else b, rank, step, 1.0)
    # a's own ranks are done, but the run is not: ranks 2 and 3 still train (counting
    # only what a saw would call it finished and silence the hang checks).
    assert [finish(a, 0), finish(a, 1)] == ["rank_finished", "rank_finished"]
    assert a.reads.get_run_row("r")["status"] == "running"
    assert finish(b, 2) == "rank_finished"
    assert finish(b, 3) == "finish"   # b never saw ranks 0 and 1 finish: the database did
    assert a.reads.get_run_row("r")["status"] == "finished"


def test_last_finishes_taken_at_once_by_two_replicas_finish_the_run(replicas):
    """The ranks of a job finish together: the last two finishes reach two replicas at once.
    Each must see the other's (the run's row is locked), or neither would finish the run."""
    import threading
    a, b = replicas
    for rounds in range(10):
        run = f"r{rounds}"
        for rank in range(2):
            push(a if rank == 0 else b, rank, 0, 1.0, run)
        start, kinds = threading.Barrier(2), {}

        def finish_on(store, rank):
            start.wait()
            kinds[rank] = store.control.submit_finish(run, rank).result(10).kind

        threads = [threading.Thread(target=finish_on, args=(s, r)) for r, s in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(kinds.values()) == ["finish", "rank_finished"], (run, kinds)
        assert a.reads.get_run_row(run)["status"] == "finished"


def test_a_finished_run_restarted_through_a_replica_that_did_not_see_it_finish_runs_again(replicas):
    # b takes the last finish; the job is then resumed from a checkpoint (a new process on every
    # rank) and its first push reaches a, which never heard of the finish: the run runs again
    # on every replica (its status, and the hang checks that follow it), not only where it finished.
    a, b = replicas
    for step in range(5):
        for rank in range(2):
            push(a if rank == 0 else b, rank, step, 1.0, process="p1")
    assert [finish(a, 0), finish(b, 1)] == ["rank_finished", "finish"]
    assert a.reads.get_run_row("r")["status"] == "finished"
    assert push(a, 0, 3, 2.0, process="p2") == 2
    assert a.reads.get_run_row("r")["status"] == b.reads.get_run_row("r")["status"] == "running"
    assert push(b, 1, 3, 2.0, process="p2") == 2
    # The resumed attempt finishes by its own ranks' finishes, on either replica.
    assert [finish(b, 0), finish(a, 1)] == ["rank_finished", "finish"]
    assert b.reads.get_run_row("r")["status"] == "finished"
