"""Run leases on the real PostgreSQL: one owner at a time, takeover after expiry with a new fencing
token, a stale owner's fenced write refused, release on stop, pushes handed on within 100 ms."""
from __future__ import annotations

import statistics
import threading
import time

import psycopg
import pytest

from healthsvc.store.open import open_store
from healthsvc.ownership.leases import PgLeases
from healthsvc.store.fencing import LeaseLost, check_fence
from tests.pg import fresh_database


@pytest.fixture
def dsn():
    """A fresh database at the current schema (the leases table is the store's)."""
    with fresh_database() as dsn:
        store = open_store(dsn)
        store.open()
        store.close()
        yield dsn


class Events:
    """What a replica's lease layer told its hub, with a barrier per kind."""

    def __init__(self) -> None:
        self.gained: list[str] = []
        self.lost: list[str] = []
        self.remote: list[tuple[str, dict, float]] = []
        self.changed = threading.Condition()

    def _add(self, into: list, item) -> None:
        with self.changed:
            into.append(item)
            self.changed.notify_all()

    def callbacks(self) -> dict:
        return {"on_gained": lambda r: self._add(self.gained, r), "on_lost": lambda r: self._add(self.lost, r),
                "on_remote": lambda r, m: self._add(self.remote, (r, m, time.monotonic()))}

    def wait(self, into: list, n: int, timeout_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(into) >= n, timeout_s)


def replica(dsn: str, name: str, ttl_s: float = 2.0) -> tuple[PgLeases, Events]:
    leases, events = PgLeases(dsn, ttl_s=ttl_s, replica_id=name), Events()
    leases.start(**events.callbacks())
    return leases, events


def test_one_owner_then_takeover_with_a_new_token_and_the_stale_write_refused(dsn):
    a, a_events = replica(dsn, "a")
    b, b_events = replica(dsn, "b")
    try:
        assert a.claim("r1") and a.owns("r1")
        assert not b.claim("r1") and not b.owns("r1")
        stale = a.fence("r1")
        assert stale is not None and stale.token == 1
        with psycopg.connect(dsn, autocommit=True) as conn:
            check_fence(conn.cursor(), stale)          # the owner's write passes
        # a dies: its threads stop, nothing is released (a SIGKILL)
        a._stopping.set()
        for t in a._threads:
            t.join(5)
        assert b_events.wait(b_events.gained, 1, timeout_s=b.ttl_s * 3), "b never took r1 over"
        # (gained again only if b's own renewal came late: the lease lapsed here, nobody took it)
        assert set(b_events.gained) == {"r1"} and b.owns("r1") and b.fence("r1").token == 2
        assert not a.owns("r1")                        # a's own clock ran out before the database's
        with psycopg.connect(dsn, autocommit=True) as conn:
            with pytest.raises(LeaseLost):
                check_fence(conn.cursor(), stale)
            check_fence(conn.cursor(), b.fence("r1"))
        a.renew()                                      # a comes back: it learns it lost the run
        assert a_events.lost == ["r1"] and not a.claim("r1")
    finally:
        b.stop()


def test_stop_releases_and_another_replica_sweeps_the_run_at_once(dsn):
    a, _ = replica(dsn, "a", ttl_s=30.0)
    b, b_events = replica(dsn, "b", ttl_s=30.0)
    try:
        assert a.claim("r1")
        a.stop()
        b.renew()                                      # its next beat; no 30 s wait for an expiry
        assert b_events.gained == ["r1"] and b.owns("r1")
        assert b.held() == {"r1": 2}
    finally:
        b.stop()


def test_a_push_accepted_elsewhere_reaches_the_owner_within_100_ms(dsn):
    owner, owner_events = replica(dsn, "owner", ttl_s=5.0)
    other, _ = replica(dsn, "other", ttl_s=5.0)
    try:
        assert owner.claim("r1") and not other.claim("r1")
        assert owner.listening.wait(5)
        latencies = []
        for i in range(20):
            sent = time.monotonic()
            other.announce("r1", {"chunks": [i]})
            assert owner_events.wait(owner_events.remote, i + 1, timeout_s=2.0)
            latencies.append(owner_events.remote[-1][2] - sent)
        assert [m for _, m, _ in owner_events.remote][-1] == {"chunks": [19]}
        # Announced by NOTIFY, not found by a poll: the typical push arrives within 100 ms. (The
        # median, not the maximum: on a loaded machine one wake-up of twenty can come late.)
        assert statistics.median(latencies) < 0.1, latencies
    finally:
        owner.stop()
        other.stop()


def test_the_store_refuses_a_stale_owners_snapshot_and_findings(dsn):
    """The fence is checked in the write's own transaction: after a takeover, the old owner's
    snapshot and findings are refused (LeaseLost), the new owner's stored."""
    from healthsvc_detectors.finding import Finding

    a, _ = replica(dsn, "a", ttl_s=30.0)
    b, b_events = replica(dsn, "b", ttl_s=30.0)
    store = open_store(dsn)
    store.open()
    try:
        assert a.claim("r1")
        stale = a.fence("r1")
        a.stop()                          # released: b sweeps it at its next beat
        b.renew()
        assert b_events.gained == ["r1"]
        with pytest.raises(LeaseLost):
            store.save_snapshot("r1", "monitor", 7, b"old owner", fence=stale).result(10)
        store.save_snapshot("r1", "monitor", 9, b"new owner", fence=b.fence("r1")).result(10)
        assert store.snapshots("monitor")["r1"].state == b"new owner"
        f = Finding("non_finite", step=3, ranks=(1,), severity="critical", metric="loss")
        with pytest.raises(LeaseLost):
            store.findings.submit("r1", 1, [f], {}, fence=stale).result(10)
        assert store.findings.submit("r1", 1, [f], {}, fence=b.fence("r1")).result(10).findings
    finally:
        store.close()
        b.stop()


def test_a_running_run_that_nobody_claimed_is_taken_by_the_sweep(dsn):
    # The replica that stored a run's first push died before its monitor claimed the run: the
    # run has no lease row. The next sweep of any replica a TTL after the run was created takes
    # it (a finished run stays unowned); a younger run is left to the replica claiming it.
    import numpy as np
    from healthsvc.store.batch import MetricBatch

    def one_record() -> MetricBatch:
        b = MetricBatch(steps=np.array([0]), ranks=np.array([0]))
        b.values["loss"], b.present["loss"] = np.array([1.0]), np.array([True])
        return b

    store = open_store(dsn)
    store.open()
    try:
        store.ingest.submit_metrics("orphan", one_record(), "d1").result(10)
        store.ingest.submit_metrics("done", one_record(), "d2").result(10)
        store.control.submit_finish("done").result(10)
    finally:
        store.close()
    a, events = replica(dsn, "a", ttl_s=30.0)   # a long TTL: the only sweeps are the ones called below
    try:
        assert a.held() == {}
        a.renew()                                # created just now: its creator may still claim it
        assert a.held() == {} and events.gained == []
        with psycopg.connect(dsn, autocommit=True) as conn:   # ... and now created a TTL ago
            conn.execute("UPDATE runs SET created_at = created_at - 31")
        a.renew()
        assert events.wait(events.gained, 1, 5) and events.gained == ["orphan"]
        assert a.owns("orphan") and not a.owns("done")
    finally:
        a.stop()


def waiting_on_a_lock(conn: psycopg.Connection, n: int, timeout_s: float = 30.0) -> bool:
    """Whether ``n`` other sessions of this database wait on a lock within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(conn.info.dsn, autocommit=True) as probe:
        while time.monotonic() < deadline:
            (waiting,) = probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()").fetchone()
            if waiting >= n:
                return True
            time.sleep(0.01)
    return False


def test_a_renewal_that_deadlocks_with_a_fenced_write_is_retried_and_keeps_every_lease(dsn, caplog):
    """A store's group commit holds a lease row ``FOR SHARE`` for each fenced write (in its jobs'
    order) while the renewal updates every held row: each can wait for the other. PostgreSQL
    fails one of them (the first to have waited its ``deadlock_timeout``: the renewal here); the
    renewal is retried, so no lease runs out for it (the soak saw runs lost and taken over)."""
    a, _ = replica(dsn, "a", ttl_s=60.0)   # its own renewals every 20 s: this test calls renew()
    writer = psycopg.connect(dsn)
    try:
        assert a.claim("r1") and a.claim("r2")
        writer.execute("SELECT 1 FROM leases WHERE run_id = 'r2' FOR SHARE")   # a fenced write of r2
        errors: list[Exception] = []

        def renew() -> None:
            try:
                a.renew()
            except Exception as exc:  # noqa: BLE001 - what the renewal thread would log and lose leases for
                errors.append(exc)
        renewing = threading.Thread(target=renew)
        renewing.start()                   # updates r1, then waits for r2
        assert waiting_on_a_lock(writer, n=1)   # barrier: the renewal waits first, so its check fires first
        with caplog.at_level("WARNING", logger="healthsvc.ownership.leases"):
            writer.execute("SELECT 1 FROM leases WHERE run_id = 'r1' FOR SHARE")   # then one of r1: a cycle
            writer.commit()
            renewing.join(30)
        assert not renewing.is_alive() and errors == []
        assert "renewal deadlocked" in caplog.text   # the cycle happened (and was retried)
        assert a.owns("r1") and a.owns("r2") and set(a.held()) == {"r1", "r2"}
    finally:
        writer.close()
        a.stop()
