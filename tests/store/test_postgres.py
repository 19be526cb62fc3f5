"""What is PostgreSQL's own: every read format answers byte for byte what SQLite's store
answers for the same pushes (NaN, ±Inf and missing included), and the writer survives a lost
connection (the group that saw it fails with 503, the next is stored), even when cut off inside a transaction."""
from __future__ import annotations

import json
import time

import numpy as np
import psycopg
import pytest

from healthsvc.store.batch import MetricBatch
from healthsvc.store.postgres import PostgresStore
from tests.harness import InProcessService
from tests.pg import fresh_database

PUSHES = [
    {"records": [{"step": 1, "rank": 0, "loss": 1.5, "host": "a"}, {"step": 1, "rank": 1, "loss": "NaN", "host": "b"},
                 {"step": 1, "rank": 2, "loss": "Infinity"}, {"step": 1, "rank": 3, "loss": "-Infinity"},
                 {"step": 1, "rank": 4, "lr": 0.1}]},
    {"columns": {"step": [2, 2, 3], "rank": [0, 1, 0], "loss": [None, 2.0, 0.5], "grad_norm": ["NaN", 1e308, 5e-324]}},
]
READS = [("/v1/runs/r/metrics", {}), ("/v1/runs/r/metrics", {"format": "csv"}),
         ("/v1/runs/r/metrics", {"format": "arrow"}), ("/v1/runs/r/metrics", {"fields": "loss", "attempt": 1}),
         ("/v1/runs/r/metrics", {"step_min": 2, "format": "csv"})]


def answers(tmp_path, db) -> list[bytes]:
    with InProcessService(tmp_path, db=db) as svc:
        for body in PUSHES:
            assert svc.http.post("/v1/runs/r/metrics", content=json.dumps(body)).status_code == 202
        svc.drain()
        return [svc.http.get(path, params=params).content for path, params in READS]


def test_every_read_format_is_byte_for_byte_the_same_on_both_stores(tmp_path):
    on_sqlite = answers(tmp_path, tmp_path / "s.db")
    with fresh_database() as uri:
        on_postgres = answers(tmp_path, uri)
    assert on_postgres == on_sqlite
    assert b"NaN" in on_sqlite[0] and b"-Infinity" in on_sqlite[0]


def batch(step: int) -> MetricBatch:
    b = MetricBatch(steps=np.array([step]), ranks=np.array([0]))
    b.values["loss"] = np.array([np.nan])
    b.present["loss"] = np.array([True])
    return b


def test_the_writer_reconnects_after_its_connection_is_lost():
    with fresh_database() as uri:
        store = PostgresStore(uri)
        store.open()
        try:
            assert store.ingest.submit_metrics("r", batch(1), "d1").result(10).accepted == 1
            (pid,) = store.write(lambda conn: conn.execute("SELECT pg_backend_pid()").fetchone()).result(10)
            with psycopg.connect(uri, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with pytest.raises(psycopg.OperationalError):
                store.ingest.submit_metrics("r", batch(2), "d2").result(10)
            assert store.writes_failing
            assert store.ingest.submit_metrics("r", batch(3), "d3").result(10).accepted == 1
            assert not store.writes_failing
            steps = [int(s) for _, b in store.reads.iter_chunks("r") for s in b.steps]
            assert steps == [1, 3]    # the failed push stored nothing; the client retries it
        finally:
            store.close()


def test_chunk_reads_stream_in_batches_and_other_reads_go_on_meanwhile():
    from healthsvc.store.postgres import StreamedRows
    with fresh_database() as uri:
        store = PostgresStore(uri, pool_size=2)
        store.open()
        try:
            futures = [store.ingest.submit_metrics("r", batch(s), f"d{s}") for s in range(1, 2 * StreamedRows.BATCH + 7)]
            for f in futures:
                f.result(10)
            steps = []
            for _, b in store.reads.iter_chunks("r"):
                steps.extend(int(s) for s in b.steps)
                assert store.reads.run_exists("r")            # a read on the other pooled connection
            assert steps == list(range(1, 2 * StreamedRows.BATCH + 7))
            assert len(list(store.chunks_after("r", 10))) == 2 * StreamedRows.BATCH + 6 - 10
        finally:
            store.close()


def test_a_writer_cut_off_inside_a_transaction_lets_its_row_locks_go():
    """The network freezes between a group commit's statements (nothing forwarded, nothing
    closed): the server ends the session once it has idled in its transaction for
    ``IDLE_IN_TRANSACTION_S``, so another connection can take the rows it locked (a replica's
    takeover of a lease row a cut-off owner held ``FOR SHARE``), instead of waiting on TCP."""
    from healthsvc.store.postgres import IDLE_IN_TRANSACTION_S
    from tests.barriers import wait_until
    from tests.faults.proxy import FreezableProxy

    with fresh_database() as uri:
        port = int(uri.rsplit(":", 1)[1].split("/")[0])
        with psycopg.connect(uri, autocommit=True) as other:
            other.execute("CREATE TABLE held (id int PRIMARY KEY)")
            other.execute("INSERT INTO held VALUES (1)")
            with FreezableProxy(port) as proxy:
                store = PostgresStore(uri.replace(f":{port}/", f":{proxy.port}/"))
                store.open()

                def lock_then_cut_off(conn):
                    conn.execute("SELECT id FROM held WHERE id = 1 FOR SHARE")
                    proxy.freeze()   # the group's COMMIT is not forwarded

                job = store.write(lock_then_cut_off)
                held = "SELECT id FROM held FOR UPDATE SKIP LOCKED"
                # The barrier is the lock itself: a session idle in its transaction holding the
                # table's lock of a FOR SHARE (a count of sessions idle in a transaction alone also
                # saw the writer between its group's first statement and the job's, the row not
                # locked yet: the check below then failed under load).
                locked = ("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                          "WHERE l.relation = 'held'::regclass AND l.mode = 'RowShareLock' "
                          "AND l.granted AND a.state = 'idle in transaction'")
                wait_until(lambda: other.execute(locked).fetchone()[0] == 1, 10,
                           "the writer idle in its transaction, the row locked")
                assert other.execute(held).fetchall() == []          # the row is locked, so far
                cut_at = time.monotonic()
                wait_until(lambda: other.execute(held).fetchall() == [(1,)], IDLE_IN_TRANSACTION_S + 5,
                           "the row free again")
                assert time.monotonic() - cut_at <= IDLE_IN_TRANSACTION_S + 2
                proxy.thaw()
                with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                    job.result(30)                                    # the group did not commit
                try:
                    assert store.ingest.submit_metrics("r", batch(1), "d1").result(30).accepted == 1
                finally:
                    store.close()
