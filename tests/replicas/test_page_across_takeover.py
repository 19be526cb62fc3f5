"""A hang found by a run's owner that is SIGKILLed before the hang's group was first sent is paged
by the replica that takes the run over, even when the run finishes meanwhile (the soak's "hang
stored but not paged", ``docs/reliability.md``).

Why it was lost: a group with a wait (here critical, 1 s, as the soak sets it) is sent at its
first flush after the wait. The owner stored the finding and its alert, and died before that
flush. The new owner loads the run's alerts, but restores the run's detectors before its next
alerting tick; the run had finished (the finish, accepted by the other replica, was announced to
the dead owner), so the restore resolves the hang (finished is not hung), and a group whose
alerts all resolved before its first notification says nothing (Alertmanager's rule: nothing was
shown). The fix: a group whose first notification fell due while the run had no owner is sent
when the run is adopted, before the restore's findings are folded in.

Two replicas on a fresh PostgreSQL database, addressed directly. The owner's alerting never
ticks (``alert_tick_s`` an hour), so it cannot send the page itself before it is killed: the
case is the same whatever the machine's load."""
from __future__ import annotations

import json
import threading

import httpx
import psycopg
import pytest

from tests.alerting.receiver import Receiver
from tests.barriers import wait_until
from tests.pg import fresh_database
from tests.replicas.test_takeover_families import JSON, TTL_S, WORLD, Job, Steady, hangs, owns, pages
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e

HANG_S = 3.0


def newest_chunk(dsn: str, run_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT coalesce(max(id), 0) FROM chunks WHERE run_id=%s", (run_id,)).fetchone()[0]


def monitor_watermark(dsn: str, run_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT watermark FROM run_state WHERE run_id=%s AND kind='monitor'", (run_id,)).fetchone()
    return row[0] if row else -1


def resolved_hangs(rep: ServerProcess) -> list[dict] | None:
    found = httpx.get(f"{rep.url}/v1/runs/hung/findings", params={"kind": "hang"}).json()
    return found if {f["status"] for f in found} >= {"resolved"} else None


def test_a_hang_whose_owner_died_before_its_first_page_is_paged_by_the_next_owner(tmp_path):
    with Receiver() as receiver, fresh_database() as dsn:
        env = {"HEALTHSVC_LEASE_TTL_S": str(TTL_S), "HEALTHSVC_SNAPSHOT_EVERY_S": "1",
               "HEALTHSVC_ALERT_TIMINGS": json.dumps({"critical": {"group_wait_s": 1.0, "group_interval_s": 1.0}}),
               "HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "oncall", "url": receiver.url, "format": "json"}])}
        owner = ServerProcess(dsn, env={**env, "HEALTHSVC_ALERT_TICK_S": "3600"}, log_path=tmp_path / "owner.log")
        other = ServerProcess(dsn, env=env, log_path=tmp_path / "other.log")
        owner.start()
        other.start()
        try:
            job = Job(owner.url, "hung")
            config = {"world_size": WORLD, "detectors": {"hang": {"timeout_floor_s": HANG_S, "startup_timeout_s": HANG_S}}}
            assert job.http.put("/v1/runs/hung", json=config).status_code in (200, 201)
            job.steps(20)
            wait_until(lambda: owns([owner], "hung"), 10, "the owner holding the run")
            stop = threading.Event()
            steady = Steady(job, stop)   # ranks 0-2 go on; rank 3 is silent from now on
            steady.start()
            try:
                wait_until(lambda: hangs(other, "hung"), HANG_S + 5, "the owner's hang finding")
            finally:
                stop.set()
                steady.join(10)
            # The owner snapshots the run (every 1 s) with its hang open: wait for a snapshot that
            # includes the last chunk stored, which came after the hang was found.
            last_chunk = newest_chunk(dsn, "hung")
            wait_until(lambda: monitor_watermark(dsn, "hung") >= last_chunk, 15,
                       "the owner's snapshot of the run with its hang open")
            assert pages(receiver, "hung", "hang") == []   # its alerting never ticked: not sent
            owner.kill()
            with httpx.Client(base_url=other.url, timeout=10, headers=JSON) as http:
                assert http.post("/v1/runs/hung/finish", content=b"{}").status_code == 200
            wait_until(lambda: owns([other], "hung"), 3 * TTL_S + 2, "the other replica taking the run over")
            wait_until(lambda: pages(receiver, "hung", "hang"), 10, "the hang paged by the new owner")
            # The restore resolved the hang (the run finished): the case the page used to be lost in.
            # (The page goes out when the run is adopted, before the restore's resolution is stored.)
            findings = wait_until(lambda: resolved_hangs(other), 10, "the restore resolving the hang")
            assert all(f["ranks"] == [3] for f in findings)
            assert len(set(pages(receiver, "hung", "hang"))) == 1
        finally:
            owner.stop()
            other.stop()
