"""Ingest on SQLite versus PostgreSQL: points per CPU-second of the service plus the database,
on 1,024-record batches (the issue's target: PostgreSQL >= 50 % of SQLite).

Starts ``healthsvc serve`` (detectors off: ingest alone) on a fresh SQLite file, then on a fresh
PostgreSQL database on 127.0.0.1:5432 (user postgres), and pushes the same pre-serialised
columnar batches from client threads (``bench/ingest.py``'s load). CPU: the server process from
/proc; for PostgreSQL also its backends of the bench's database (pg_stat_activity) and the
server's WAL writer, which others on the machine may share (so the figure is a bound).

    .venv/bin/python bench/store_ingest.py [--seconds 6] [--threads 4] [--records 1024] [--smoke]

``--smoke`` (the tests): 64-record batches for 0.2 s on each store.
"""
from __future__ import annotations

import argparse
import atexit
import os
import secrets
import shutil
import sys
import tempfile

import psycopg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.ingest import FIELDS, run_case  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402

ADMIN = os.environ.get("HEALTHSVC_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def proc_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PgCpu:
    """CPU seconds of the PostgreSQL processes that serve one database (its backends, the WAL writer)."""

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname

    def pids(self) -> list[int]:
        with psycopg.connect(ADMIN, autocommit=True) as c:
            return [p for (p,) in c.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s OR backend_type = 'walwriter'", (self.dbname,))]

    def __call__(self, pids: list[int]) -> float:
        return sum(proc_cpu(p) for p in pids)


def measure(db: str, seconds: float, threads: int, records: int, pg: PgCpu | None, warm_s: float = 1.0,
            payloads: int = 4000) -> dict:
    tmp = tempfile.mkdtemp(prefix="healthsvc-store-bench-")
    server = ServerProcess(db, env={"HEALTHSVC_DETECT": "0"}, log_path=os.path.join(tmp, "server.log"))
    print(f"{db}: server log {server.log_path}", file=sys.stderr)
    server.start()
    try:
        run_case(server, "columns", records - 1, warm_s, threads, payloads)   # warm up (another run: no duplicates)
        pids = pg.pids() if pg else []
        db0 = pg(pids) if pg else 0.0
        res = run_case(server, "columns", records, seconds, threads, payloads)
        db_cpu = (pg(pids) - db0) if pg else 0.0
    finally:
        server.stop()
    points = res["requests"] * records * len(FIELDS)
    service_cpu = points / res["points_per_cpu_s"]
    res.update(db_cpu_s=db_cpu, service_cpu_s=service_cpu,
               points_per_total_cpu_s=points / (service_cpu + db_cpu))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--records", type=int, default=1024)
    ap.add_argument("--smoke", action="store_true", help="64 records, 0.2 s: proves it runs (tests)")
    args = ap.parse_args()
    warm_s, payloads = 1.0, 4000
    if args.smoke:
        args.seconds, args.threads, args.records, warm_s, payloads = 0.2, 2, 64, 0.2, 100
    out = {}
    sqlite_dir = tempfile.mkdtemp(prefix="healthsvc-store-bench-db-")
    atexit.register(shutil.rmtree, sqlite_dir, True)   # the store; the servers' logs are kept (printed above)
    out["sqlite"] = measure(os.path.join(sqlite_dir, "bench.db"), args.seconds, args.threads, args.records,
                            None, warm_s, payloads)
    name = f"hs_bench_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    try:
        out["postgresql"] = measure(ADMIN.rsplit("/", 1)[0] + "/" + name, args.seconds, args.threads, args.records,
                                    PgCpu(name), warm_s, payloads)
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    print("| store | requests | errors | M points / wall-s | M points / service CPU-s | database CPU-s "
          "| M points / (service + database) CPU-s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for store, r in out.items():
        print(f"| {store} | {r['requests']:,} | {r['errors']:,} | {r['points_per_wall_s'] / 1e6:.2f} | {r['points_per_cpu_s'] / 1e6:.2f} "
              f"| {r['db_cpu_s']:.2f} | {r['points_per_total_cpu_s'] / 1e6:.2f} |")
    ratio = out["postgresql"]["points_per_total_cpu_s"] / out["sqlite"]["points_per_total_cpu_s"]
    print(f"\nPostgreSQL / SQLite, points per (service + database) CPU-second: {ratio:.0%}")


if __name__ == "__main__":
    main()
