"""Scale-out: simulated jobs pushing per rank, through nginx, to 1, 2 and 3 replicas.

Each case starts fresh replicas (``healthsvc serve``, detectors on) on a fresh store, nginx
in front of them (the shipped ``examples/scale_out/nginx.conf``, as the tests run it: a run's
pushes hashed to one replica; ``--routing round-robin`` takes the hash out),
and simulated jobs: ``--jobs`` runs of ``--ranks`` ranks, each rank pushing one record per step at
``--step-rate`` steps per second (open loop: a push is due at its step's time, whether or not the
last one came back). ``--per-push 8`` is what a per-host relay sends (8 ranks per host: one
columnar push per host and step); 1024 is a big aggregated batch.

Reported per case: requests and points offered and acknowledged per second, p50 / p99 push latency
(client side, through nginx), CPU-seconds of the replicas, of the database (the PostgreSQL backends
serving the case's database, from /proc via psutil; SQLite runs inside the replica), and of nginx,
and requests and points per CPU-second of service plus database, net of what the replicas and
the database spend idle (measured for ``--idle`` seconds before each case, after a warm-up step;
shown as ``idle cpu/s``). The yardstick, measured in the same run: a bare uvicorn app
(``bench/bare_asgi.py``: reads the body, answers 202) behind the same nginx under the same load,
one ``bare`` row per push size (``x bare``: the case's requests per CPU-second over that row's);
``x sat.`` divides by the bare app's saturated rate instead (GET /healthz, closed loop, where
uvicorn answers several requests per wake-up: a cheaper floor than any open-loop load). Then the sizing of a 16,384-rank job at one
step per second from the measured per-request costs, with and without the relay.

    .venv/bin/python bench/scale.py [--seconds 8] [--ranks 256] [--step-rate 1] [--replicas 1,2,3]
                                    [--stores sqlite,postgresql] [--per-push 1,8] [--batch-case] [--smoke]

``--smoke`` (the tests): half a second of one 8-rank job, SQLite and the bare app only.

``--grid``: how the cost grows with the work instead. CPU per record of one SQLite replica (the
service's own, idle subtracted) at 1,024, 4,096 and 16,384 ranks per job (one job), and at 1, 8
and 64 jobs of 1,024 ranks, every host's 8 ranks in one relay push (``--per-push``). Closed
loop for ``--seconds`` a cell after one warm-up step of every rank (the runs exist, each rank has
a step): a job of 16,384 ranks at one step a second is more than two shared cores answer, so the
cells measure cost per record, not whether a real-time rate is kept. The 16,384 x 64 corner
(a million ranks) is left out: its warm-up step alone is 131,072 pushes. ``idle CPU-s / s`` is
what the replica spends with no push (its tickers over the runs it watches): the part of a job's
cost that does not come with its records, subtracted from the per-record figures.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import tempfile
import threading
import time
import zlib
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest import BareASGI, floor_case  # noqa: E402  (bench/ingest.py)
from tests.replicas.balancer import Balancer  # noqa: E402
from tests.server_process import ServerProcess, free_port  # noqa: E402

FIELDS = ("loss", "grad_norm", "local_grad_norm", "step_time", "compute_time", "comm_time")


# What a healthy synchronous job reports: the all-reduced gradient norm and the step time are one
# value per step, the same on every rank (drawn from the run and step, whichever push carries
# them); loss, local gradient norm, compute and communication time vary by rank. (Independent
# per-rank gradient norms are replicas that disagree: a true page, and rollback reads with it.)
SHARED = ("grad_norm", "step_time")


def body(run_id: str, step: int, ranks: np.ndarray, rng: np.random.Generator) -> bytes:
    cols = {"step": [step] * len(ranks), "rank": ranks.tolist()}
    per_step = np.random.default_rng([zlib.crc32(run_id.encode()), step])
    for f in FIELDS:
        if f in SHARED:
            cols[f] = [1.0 + 0.05 * float(per_step.standard_normal())] * len(ranks)
        else:
            cols[f] = (1.0 + 0.05 * rng.standard_normal(len(ranks))).tolist()
    cols["incarnation"] = [f"{run_id}-p{r}" for r in ranks.tolist()]   # each rank's process, as the client sends
    return orjson.dumps({"columns": cols})


class Load:
    """Open-loop pushers: ``workers`` threads share the pushes of every step, each with a
    keep-alive client to the balancer; latencies in seconds, per acknowledged push."""

    def __init__(self, url: str, jobs: int, ranks: int, step_rate: float, per_push: int, workers: int,
                 first_step: int = 0) -> None:
        self.url, self.jobs, self.ranks, self.step_rate, self.per_push = url, jobs, ranks, step_rate, per_push
        self.first_step = first_step   # after a warm-up: its steps are not pushed again
        self.workers = workers
        self.latencies: list[float] = []
        self.acked = self.failed = self.offered = 0
        self.wall = 0.0
        self.lock = threading.Lock()

    def pushes(self) -> list[tuple[str, np.ndarray]]:
        groups = [np.arange(i, min(i + self.per_push, self.ranks)) for i in range(0, self.ranks, self.per_push)]
        return [(f"job{j}", g) for j in range(self.jobs) for g in groups]

    def run(self, seconds: float, stop: threading.Event | None = None) -> float:
        """Push for ``seconds`` (``inf``: until ``stop`` is set); the wall time taken."""
        todo = self.pushes()
        stop = stop or threading.Event()
        start = time.perf_counter()
        # step_rate 0: closed loop, each worker's next push as soon as its last came back, for
        # ``seconds`` (the saturated rate); else open loop, a fixed number of steps.
        closed = self.step_rate <= 0
        steps = max(1, int(seconds * self.step_rate)) if not closed and math.isfinite(seconds) else None
        issued = [0] * self.workers

        def worker(w: int) -> None:
            rng = np.random.default_rng(w)
            mine = todo[w::self.workers]
            lat, ok, bad = [], 0, 0
            with httpx.Client(base_url=self.url, timeout=30, headers={"content-type": "application/json"}) as c:
                for n in itertools.count():
                    step = self.first_step + n
                    if stop.is_set() or (steps is not None and n >= steps):
                        break
                    if closed:
                        if time.perf_counter() - start >= seconds:
                            break
                    else:
                        pause = start + n / self.step_rate - time.perf_counter()
                        if pause > 0 and stop.wait(pause):
                            break
                    issued[w] += len(mine)
                    for run_id, ranks in mine:
                        t0 = time.perf_counter()
                        try:
                            good = c.post(f"/v1/runs/{run_id}/metrics", content=body(run_id, step, ranks, rng)).status_code == 202
                        except httpx.HTTPError:
                            good = False
                        if good:
                            ok += 1
                            lat.append(time.perf_counter() - t0)
                        else:
                            bad += 1
            with self.lock:
                self.latencies += lat
                self.acked += ok
                self.failed += bad

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.offered = sum(issued)
        self.wall = time.perf_counter() - start
        return self.wall


class Cpu:
    """CPU-seconds of a set of processes between two readings (processes that ended count up
    to their last reading)."""

    def __init__(self, pids) -> None:
        self.pids = pids          # a callable: the pids to follow now
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def read(self) -> None:
        for pid in self.pids():
            try:
                t = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            self.first.setdefault(pid, t.user + t.system)
            self.last[pid] = t.user + t.system

    def seconds(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.last)


def pg_backends(dsn: str):
    import psycopg

    def pids() -> list[int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            me = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            return [p for (p,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()").fetchall() if p != me]
    return pids


def run_case(store: str, replicas: int, per_push: int, args, tmp: Path, routing: str = "hash") -> dict:
    # The batch case: one job of 1,024 ranks, each push a whole step (an aggregated batch).
    ranks, step_rate = (per_push, args.batch_rate) if per_push >= 1024 else (args.ranks, args.step_rate)
    with ExitStack() as stack:
        if store == "postgresql":
            from tests.pg import fresh_database
            db = stack.enter_context(fresh_database())
        else:
            db = str(tmp / f"scale-{replicas}-{per_push}.db")
        env = {"HEALTHSVC_LOG_LEVEL": "warning"}
        servers = ([BareASGI()] if store == "bare" else
                   [ServerProcess(db, env=env, log_path=tmp / f"replica-{store}-{replicas}-{per_push}-{i}.log")
                    for i in range(replicas)])
        for s in servers:
            if store != "bare":
                s.start()
            stack.callback(s.stop)
        lb = Balancer(tmp / f"nginx-{store}-{replicas}-{per_push}-{routing}", free_port(), [s.port for s in servers],
                      round_robin=routing == "round-robin").start()
        stack.callback(lb.stop)
        def meters() -> tuple[Cpu, Cpu, Cpu]:
            return (Cpu(lambda: [s.pid for s in servers]),
                    Cpu(lambda: [lb.proc.pid, *(c.pid for c in psutil.Process(lb.proc.pid).children())]),
                    Cpu(pg_backends(db) if store == "postgresql" else (lambda: [])))

        # Idle first: what the replicas and the database spend with no push (tickers, lease
        # renewals, the pool), subtracted below so the per-request cost is the pushes' own.
        # One step of every rank first: every run exists, every connection is open.
        Load(lb.url, args.jobs, ranks, 1.0, per_push, args.workers).run(1.0)
        idle = meters()
        for m in idle:
            m.read()
        t0 = time.perf_counter()
        time.sleep(args.idle)
        for m in idle:
            m.read()
        idle_wall = time.perf_counter() - t0
        service, nginx, database = meters()
        load = Load(lb.url, args.jobs, ranks, step_rate, per_push, args.workers, first_step=1)
        for meter in (service, nginx, database):
            meter.read()
        wall = load.run(args.seconds)
        for meter in (service, nginx, database):
            meter.read()
    lat = np.array(load.latencies) if load.latencies else np.array([np.nan])
    svc = max(service.seconds() - idle[0].seconds() * wall / idle_wall, 1e-9)
    dbc = max(database.seconds() - idle[2].seconds() * wall / idle_wall, 0.0)
    records = load.acked * per_push
    return {"store": store, "replicas": replicas, "per_push": per_push, "routing": routing,
            "offered_rps": load.offered / wall, "acked_rps": load.acked / wall, "failed": load.failed,
            "p50_ms": 1e3 * float(np.percentile(lat, 50)), "p99_ms": 1e3 * float(np.percentile(lat, 99)),
            "service_cpu": service.seconds(), "db_cpu": database.seconds(), "nginx_cpu": nginx.seconds(),
            "idle_cpu_per_s": (idle[0].seconds() + idle[2].seconds()) / idle_wall,
            "req_per_cpu": load.acked / (svc + dbc), "points_per_cpu": records * len(FIELDS) / (svc + dbc),
            "service_us_per_req": 1e6 * svc / max(load.acked, 1),
            "db_us_per_req": 1e6 * dbc / max(load.acked, 1)}


def sizing(rows: list[dict], ranks: int = 16_384, step_rate: float = 1.0, per_host: int = 8,
           utilisation: float = 0.7) -> list[str]:
    """Replicas and cores for a job, from the measured per-request costs of the PostgreSQL cases
    (the costliest replica count measured: contention included). A replica is one Python process:
    at most about one core; ``utilisation`` leaves headroom for bursts and takeovers."""
    out = []
    for per_push, label in ((1, "per rank (no relay)"), (per_host, f"per host relay ({per_host} ranks a push)")):
        cases = [r for r in rows if r["store"] == "postgresql" and r["per_push"] == per_push and r["acked_rps"] > 0]
        if not cases:
            continue
        worst = max(cases, key=lambda r: r["service_us_per_req"] + r["db_us_per_req"])
        rps = ranks * step_rate / per_push
        svc_cores = rps * worst["service_us_per_req"] / 1e6
        db_cores = rps * worst["db_us_per_req"] / 1e6
        replicas = math.ceil(svc_cores / utilisation)
        out.append(f"{ranks:,} ranks at {step_rate:g} step/s, {label}: {rps:,.0f} requests/s x "
                   f"{worst['service_us_per_req']:.0f} us (service) + {worst['db_us_per_req']:.0f} us (database) "
                   f"per request = {svc_cores:.1f} service cores -> {replicas} replicas at {utilisation:.0%}, "
                   f"and {db_cores:.1f} database cores (measured at {worst['replicas']} replica(s))")
    return out


# (ranks per job, jobs) of --grid: the ranks axis at one job, the jobs axis at 1,024 ranks.
GRID = ((1024, 1), (4096, 1), (16384, 1), (1024, 8), (1024, 64))
SMOKE_GRID = ((8, 1), (16, 1), (8, 2))


def grid(args, tmp: Path) -> None:
    """CPU per record along the ranks-per-job and the jobs axes, one SQLite replica, closed loop."""
    per_push = int(args.per_push.split(",")[-1])
    print("\n| ranks / job | jobs | records / push | acked requests / s | records / s | service us / record "
          "| service us / request | x first row (per record) | idle CPU-s / s |")
    print("|---|---|---|" + "---:|" * 6)
    first = None
    for ranks, jobs in (SMOKE_GRID if args.smoke else GRID):
        cell = argparse.Namespace(**{**vars(args), "ranks": ranks, "jobs": jobs, "step_rate": 0.0})
        r = run_case("sqlite", 1, per_push, cell, tmp)
        records = r["acked_rps"] * per_push
        us_per_record = r["service_us_per_req"] / per_push
        first = first or us_per_record
        print(f"| {ranks:,} | {jobs} | {per_push} | {r['acked_rps']:,.0f} | {records:,.0f} | {us_per_record:.1f} "
              f"| {r['service_us_per_req']:.0f} | {us_per_record / first:.2f} | {r['idle_cpu_per_s']:.3f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=128, help="ranks per job")
    ap.add_argument("--step-rate", type=float, default=1.0,
                    help="steps per second per rank (0: closed loop, as fast as the workers get answers)")
    ap.add_argument("--replicas", default="1,2,3")
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--per-push", default="1,8", help="records per push: 1 = per rank, 8 = a per-host relay")
    ap.add_argument("--workers", type=int, default=16, help="pushing threads")
    ap.add_argument("--batch-case", action="store_true", help="also 1,024-record pushes on one replica per store")
    ap.add_argument("--batch-rate", type=float, default=10.0, help="steps per second of the 1,024-rank batch case")
    ap.add_argument("--idle", type=float, default=2.0, help="seconds of idle CPU measured before each case")
    ap.add_argument("--smoke", action="store_true", help="0.5 s, one 8-rank job, SQLite: proves it runs (tests)")
    ap.add_argument("--routing", default="hash",
                    help="nginx balancing of the several-replica cases: hash (the shipped run hash), round-robin, or both")
    ap.add_argument("--grid", action="store_true", help="CPU per record at 1k/4k/16k ranks per job and 1/8/64 jobs")
    args = ap.parse_args()
    if args.grid:
        args.per_push = args.per_push if args.per_push != "1,8" else "8"
        if args.smoke:
            args.seconds, args.idle, args.workers = 0.5, 0.2, 2
        with tempfile.TemporaryDirectory(prefix="hs-scale-") as tmp:
            grid(args, Path(tmp))
        return
    if args.smoke:
        args.seconds, args.jobs, args.ranks, args.step_rate, args.idle, args.workers = 0.5, 1, 8, 4.0, 0.2, 2
        args.stores, args.per_push, args.batch_case = "sqlite", "1", False

    rows = []
    with tempfile.TemporaryDirectory(prefix="hs-scale-") as tmp:
        bare = BareASGI()
        try:
            bare_rps = floor_case(bare, 0.5 if args.smoke else 3.0, 4)
        finally:
            bare.stop()
        print(f"bare uvicorn app, saturated (GET /healthz, 4 threads, closed loop): {bare_rps:,.0f} requests per CPU-second")
        # The yardstick: the same bare app behind the same nginx under the same load (same
        # pushes, same open-loop rate) as the service, one row per push size.
        sizes = [int(x) for x in args.per_push.split(",")] + ([1024] if args.batch_case else [])
        cases = [("bare", 1, per_push, "hash") for per_push in sizes]
        routings = args.routing.split(",")
        for store in args.stores.split(","):
            for per_push in (int(x) for x in args.per_push.split(",")):
                # SQLite is one file with one writer: one replica only.
                for n in ([1] if store == "sqlite" else [int(x) for x in args.replicas.split(",")]):
                    # One replica: every routing sends everything to it.
                    cases += [(store, n, per_push, routing) for routing in (routings if n > 1 else routings[:1])]
            if args.batch_case:
                cases.append((store, 1, 1024, routings[0]))
        print("\n| store | replicas | routing | records / push | offered / s | acked / s | failed | p50 ms | p99 ms "
              "| service CPU-s | database CPU-s | nginx CPU-s | requests / CPU-s | points / CPU-s | x bare | x sat. "
              "| idle CPU-s / s |")
        print("|---|---|---|---|" + "---:|" * 13)
        same_load: dict[int, float] = {}
        for store, n, per_push, routing in cases:
            r = run_case(store, n, per_push, args, Path(tmp), routing)
            if store == "bare":
                same_load[per_push] = r["req_per_cpu"]
            else:
                rows.append(r)
            print(f"| {r['store']} | {r['replicas']} | {r['routing'] if n > 1 else '-'} | {r['per_push']} | {r['offered_rps']:,.0f} | {r['acked_rps']:,.0f} "
                  f"| {r['failed']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['service_cpu']:.2f} | {r['db_cpu']:.2f} "
                  f"| {r['nginx_cpu']:.2f} | {r['req_per_cpu']:,.0f} | {r['points_per_cpu']:,.0f} "
                  f"| {r['req_per_cpu'] / same_load[per_push]:.3f} | {r['req_per_cpu'] / bare_rps:.3f} "
                  f"| {r['idle_cpu_per_s']:.3f} |", flush=True)
    print()
    for line in sizing(rows):
        print(line)


if __name__ == "__main__":
    main()
