"""The shipped nginx configuration hashes a run's requests to one replica (issue #28, point 4).

Three replicas on one fresh PostgreSQL database behind real nginx started from
``examples/scale_out/nginx.conf``, with an access log of where each request went. What must hold:

- every push of one run reaches the same replica, and different runs spread over all three;
- that replica is the run's lease owner (the run's first push claimed it there), so no push was
  handed on by NOTIFY;
- a replica going down moves only its own runs: every other run stays where it was, and the
  moved runs' pushes are still accepted, each run on one surviving replica.

48 runs: with three replicas on the hash ring, the chance that one replica gets none of them is
about 3 x (2/3)^48, 1e-8 (the replicas' ports, hence the ring, differ from run to run).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.pg import fresh_database
from tests.replicas.balancer import Balancer
from tests.server_process import ServerProcess, free_port

pytestmark = pytest.mark.e2e

RUNS = [f"hashed-{i}" for i in range(48)]


def push(http: httpx.Client, run_id: str, step: int) -> int:
    body = {"columns": {"step": [step, step], "rank": [0, 1], "loss": [2.0, 2.1]}}
    return http.post(f"/v1/runs/{run_id}/metrics", json=body).status_code


def replica_of(routed: list[tuple[str, list[int]]]) -> dict[str, set[int]]:
    """run -> the replicas that answered its pushes (the last port nginx tried: the one that took it)."""
    out: dict[str, set[int]] = {}
    for path, ports in routed:
        if path.endswith("/metrics"):
            out.setdefault(path.split("/")[3], set()).add(ports[-1])
    return out


def counter(replica: ServerProcess, name: str) -> float:
    text = httpx.get(replica.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.fixture
def cluster(tmp_path):
    with fresh_database() as dsn:
        # The default lease TTL (10 s): another replica's sweep leaves a new run to its creator
        # for that long, however slowly a loaded machine lets the creator claim it.
        replicas = [ServerProcess(dsn, log_path=tmp_path / f"replica{i}.log") for i in range(3)]
        replicas[0].start()          # the first one migrates the fresh database
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda r: r.start(), replicas[1:]))
        balancer = Balancer(tmp_path / "nginx", free_port(), [r.port for r in replicas], access_log=True).start()
        try:
            yield replicas, balancer
        finally:
            balancer.stop()
            for rep in replicas:
                rep.stop()


def test_a_runs_pushes_land_on_its_owner_and_a_lost_replica_moves_only_its_runs(cluster):
    replicas, balancer = cluster
    with httpx.Client(base_url=balancer.url, timeout=10) as http:
        for step in range(3):
            assert [push(http, run, step) for run in RUNS] == [202] * len(RUNS)
        before = replica_of(balancer.routed())
        assert all(len(before[run]) == 1 for run in RUNS), before
        home = {run: next(iter(before[run])) for run in RUNS}
        assert set(home.values()) == {r.port for r in replicas}, "every replica takes some runs"

        # Each run's owner is the replica its pushes reach: all of them were local.
        owner = {run: rep.port for rep in replicas
                 for run in httpx.get(rep.url + "/readyz", timeout=5).json()["leases"]}
        assert owner == home
        assert sum(counter(rep, "healthsvc_lease_notifications_sent_total") for rep in replicas) == 0

        # One replica goes down: its runs move, no other run does.
        gone = replicas[1]
        gone.stop()
        logged = len(balancer.routed())
        for step in range(3, 6):
            assert [push(http, run, step) for run in RUNS] == [202] * len(RUNS)
        after = replica_of(balancer.routed()[logged:])
    survivors = {r.port for r in replicas} - {gone.port}
    for run in RUNS:
        if home[run] == gone.port:
            assert len(after[run]) == 1 and after[run] <= survivors, (run, after[run])
        else:
            assert after[run] == {home[run]}, (run, home[run], after[run])
