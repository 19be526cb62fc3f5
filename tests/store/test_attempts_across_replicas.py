"""A restart seen by one replica is the run's restart on every replica: two stores on one
PostgreSQL database (two replicas behind a balancer) take a run's pushes in turn; after the job
restarts from a checkpoint, a replica that never saw a rank's old steps must not store that
rank's repeated steps in the old attempt (the run's history would then hold a step twice in one
attempt, and read back the stale record)."""
from __future__ import annotations

import numpy as np

from healthsvc.history import load_history
from healthsvc.ingest.batch import MetricBatch
from healthsvc.store.postgres import PostgresStore
from tests.pg import fresh_database

RANKS = 4


def push(store: PostgresStore, rank: int, step: int, loss: float) -> int:
    b = MetricBatch(steps=np.array([step]), ranks=np.array([rank]))
    b.values["loss"] = np.array([loss])
    b.present["loss"] = np.array([True])
    return store.submit_metrics("r", b, f"{rank}-{step}-{loss}").result(10).attempt


def test_a_replica_joins_the_attempt_another_replica_opened():
    with fresh_database() as uri:
        a, b = PostgresStore(uri), PostgresStore(uri)
        a.open()
        b.open()
        try:
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
            assert [(x["attempt"], x["start_step"]) for x in a.attempts("r")] == [(1, 0), (2, 21)]
            for store in (a, b):   # both replicas answer the same history
                h = load_history(store, "r")
                got = sorted(zip(h.steps.tolist(), h.ranks.tolist(), h.attempts.tolist(), h.values["loss"].tolist()))
                want = sorted((s, r, 1 if s <= 20 else 2, 1.0 if s <= 20 else 2.0)
                              for s in range(40) for r in range(RANKS))
                assert got == want
        finally:
            a.close()
            b.close()
