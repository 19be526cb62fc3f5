"""A group commit: a job that fails rolls back alone (within its savepoint, or the whole transaction
when no job before it holds work), the others of its group are stored, and the connection is fit
for the next group (on PostgreSQL the writer's savepoints are sent together with
the next control statement: a failure must not leave one of them pending or the transaction open)."""
from __future__ import annotations

import threading

import pytest

from healthsvc.store.open import open_store

pytestmark = pytest.mark.both_stores


def _insert(run_id: str, fail: str | None = None):
    def job(conn):
        conn.execute("INSERT INTO runs (run_id, created_at, updated_at) VALUES (?, ?, ?)", (run_id, 1.0, 1.0))
        if fail == "python":
            raise ValueError("the job's own error")
        return run_id
    return job


def test_a_failing_job_rolls_back_alone_and_the_next_group_commits(db_uri):
    store = open_store(db_uri)
    store.open()
    try:
        gate, held = threading.Event(), threading.Event()

        def hold(conn):
            held.set()
            assert gate.wait(10)
        first = store.write(hold)
        assert held.wait(10)
        # Queued while the writer is held: these four run as one group.
        futures = {name: store.write(job) for name, job in [
            ("ok1", _insert("ok1")),
            ("dup", _insert("ok1")),                    # the database refuses it (run_id is the key)
            ("py", _insert("py", fail="python")),       # the job raises after its insert
            ("ok2", _insert("ok2")),
        ]}
        gate.set()
        first.result(10)
        assert futures["ok1"].result(10) == "ok1" and futures["ok2"].result(10) == "ok2"
        with pytest.raises(Exception):
            futures["dup"].result(10)
        with pytest.raises(ValueError):
            futures["py"].result(10)
        # A group that opens with failures (nothing before them to protect: the transaction is
        # rolled back and begun again), then good jobs.
        gate.clear(), held.clear()
        first = store.write(hold)
        assert held.wait(10)
        opening = {name: store.write(job) for name, job in [
            ("py3", _insert("py3", fail="python")),
            ("dup2", _insert("ok1")),
            ("ok4", _insert("ok4")),
            ("ok5", _insert("ok5")),
        ]}
        gate.set()
        first.result(10)
        with pytest.raises(ValueError):
            opening["py3"].result(10)
        with pytest.raises(Exception):
            opening["dup2"].result(10)
        assert opening["ok4"].result(10) == "ok4" and opening["ok5"].result(10) == "ok5"
        # A lone failing job, then a lone good one: each its own group.
        with pytest.raises(ValueError):
            store.write(_insert("py2", fail="python")).result(10)
        assert store.write(_insert("ok3")).result(10) == "ok3"
        stored = [r for r in ("ok1", "ok2", "ok3", "ok4", "ok5", "py", "py2", "py3") if store.reads.get_run_row(r)]
        assert stored == ["ok1", "ok2", "ok3", "ok4", "ok5"]
        assert not store.writes_failing
    finally:
        store.close()
