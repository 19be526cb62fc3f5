"""A hang found while the run's lease had run out in the database (a renewal late under load) is
stored once the lease holds again: the soak's missed hang (``docs/reliability.md``: soak-15,
rank 578, no finding at all).

Why it was lost: the owner's findings write carries the lease (a fence), which the store checks
in the write's transaction; a lease whose renewal came late has expired there, so the write
failed, and nothing looked at its failure. The hang detector fires once per silence, and the
owner kept the run (the late renewal extended the same lease, nobody had taken it), so the hang
was never raised again; the snapshots saved after it said it was open. The fix: the monitor hub
keeps findings whose write failed (or that were raised in a moment the lease was not its own)
and records them again at its next tick while it still watches the run, and saves no snapshot of
a run past findings not yet stored.

One replica on a fresh PostgreSQL database. A trigger holds run ``lapse``'s lease expired in the
database while the replica goes on renewing it (the renewal is accepted, as a late renewal of a
lease nobody took is), so every fenced write of that run fails as in the soak, whatever the
machine's load. A second run, ``clock``, whose lease is left alone and whose rank goes silent a
second later than ``lapse``'s, is the barrier: the monitor raises ``lapse``'s hang at the same
tick as ``clock``'s or earlier, and writes it first (the store's writer is first in, first out),
so once ``clock``'s hang is stored, ``lapse``'s write has been tried.
"""
from __future__ import annotations

import threading

import psycopg
import pytest

from tests.barriers import wait_until
from tests.pg import fresh_database
from tests.replicas.test_takeover_families import WORLD, Job, hangs, owns
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e

HANG_S = 2.0
TTL_S = 3.0

FREEZE = """
CREATE TABLE lease_freeze (run_id text PRIMARY KEY);
CREATE FUNCTION lease_freeze() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM lease_freeze f WHERE f.run_id = NEW.run_id) THEN
        NEW.expires_at := extract(epoch FROM clock_timestamp()) - 1;
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER lease_freeze BEFORE INSERT OR UPDATE ON leases FOR EACH ROW EXECUTE FUNCTION lease_freeze();
"""


class Pushing(threading.Thread):
    """Every 0.1 s one step of each job, ranks 0-2; rank 3 of a job goes silent once its
    ``silent`` event is set."""

    def __init__(self, jobs: list[Job], silent: list[threading.Event], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.jobs, self.silent, self.stop = jobs, silent, stop

    def run(self) -> None:
        while not self.stop.is_set():
            for job, quiet in zip(self.jobs, self.silent):
                job.steps(1, ranks=range(WORLD - 1) if quiet.is_set() else range(WORLD))
            self.stop.wait(0.1)


def test_a_hang_whose_findings_write_met_an_expired_lease_is_stored_once_the_lease_holds(tmp_path):
    with fresh_database() as dsn:
        rep = ServerProcess(dsn, env={"HEALTHSVC_LEASE_TTL_S": str(TTL_S), "HEALTHSVC_SNAPSHOT_EVERY_S": "1"},
                            log_path=tmp_path / "replica.log", extra_args=["--log-level", "info"])
        rep.start()
        try:
            config = {"world_size": WORLD, "detectors": {"hang": {"timeout_floor_s": HANG_S, "startup_timeout_s": HANG_S}}}
            lapse, clock = Job(rep.url, "lapse"), Job(rep.url, "clock")
            for job in (lapse, clock):   # lapse first: the monitor ticks its runs in that order
                assert job.http.put(f"/v1/runs/{job.run_id}", json=config).status_code in (200, 201)
                job.steps(10)
            wait_until(lambda: owns([rep], "lapse") and owns([rep], "clock"), 10, "the replica holding both runs")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(FREEZE)
                conn.execute("INSERT INTO lease_freeze VALUES ('lapse')")
                conn.execute("UPDATE leases SET expires_at = expires_at WHERE run_id = 'lapse'")

            stop = threading.Event()
            silent = [threading.Event(), threading.Event()]
            pushing = Pushing([lapse, clock], silent, stop)
            pushing.start()
            try:
                wait_until(lambda: lapse.step >= 15, 10, "lapse's ranks pushing")
                silent[0].set()                                   # lapse's rank 3 goes silent,
                quiet_from = lapse.step
                wait_until(lambda: lapse.step >= quiet_from + 10, 10, "a second more of pushes")
                silent[1].set()                                   # clock's a second later
                wait_until(lambda: hangs(rep, "clock"), HANG_S + 20, "clock's hang stored")
                # lapse's hang was raised and its write tried (and failed: the lease had expired).
                assert owns([rep], "lapse")
                assert not hangs(rep, "lapse")
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("DELETE FROM lease_freeze")       # the next renewal holds again
                found = wait_until(lambda: hangs(rep, "lapse"), 3 * TTL_S + 10, "lapse's hang stored")
            finally:
                stop.set()
                pushing.join(10)
            assert [ranks for ranks, _ in found] == [[WORLD - 1]]             # found once
        finally:
            rep.stop()
