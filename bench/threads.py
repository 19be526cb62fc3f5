"""Where a single-record push's CPU goes: per-thread CPU of the replicas, per acknowledged push.

Starts ``--replicas`` replicas (detectors on) on a fresh PostgreSQL database, or one on a fresh
SQLite file (``--store sqlite``), the shipped nginx in front when there are several, and the
open-loop single-record load of ``bench/scale.py`` (2 jobs of 128 ranks, 2 steps per second).
Reads each thread's CPU from ``/proc/<pid>/task`` before and after, and names the threads with
``py-spy dump`` when py-spy is installed (``pip install py-spy``; else by thread id). With several
replicas it also prints the notifications sent and heard (``/metrics``): pushes per notification.

    .venv/bin/python bench/threads.py [--store postgresql] [--replicas 2] [--seconds 12] [--smoke]

``--smoke`` (the tests): SQLite, one replica, one 16-rank job for half a second.
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest import thread_cpu, thread_names  # noqa: E402  (bench/ingest.py)
from scale import Load  # noqa: E402  (bench/scale.py)
from tests.replicas.balancer import Balancer  # noqa: E402
from tests.server_process import ServerProcess, free_port  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--smoke", action="store_true", help="SQLite, 0.5 s of load: proves it runs (tests)")
    args = ap.parse_args()
    # Load(jobs, ranks per job, steps per second, records per push, pushing threads)
    shape = (2, 128, 2, 1, 16)
    if args.smoke:
        args.store, args.seconds, shape = "sqlite", 0.5, (1, 16, 4, 1, 4)
    replicas = 1 if args.store == "sqlite" else args.replicas
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="hs-threads-") as tmp:
        if args.store == "postgresql":
            from tests.pg import fresh_database
            db = stack.enter_context(fresh_database())
        else:
            db = str(Path(tmp) / "threads.db")
        servers = [ServerProcess(db, env={"HEALTHSVC_LOG_LEVEL": "warning"}, log_path=Path(tmp) / f"r{i}.log")
                   for i in range(replicas)]
        for s in servers:
            s.start()
            stack.callback(s.stop)
        url = servers[0].url
        if replicas > 1:
            lb = Balancer(Path(tmp) / "nginx", free_port(), [s.port for s in servers]).start()
            stack.callback(lb.stop)
            url = lb.url
        Load(url, *shape).run(1.0 / shape[2])          # every run exists, every connection is open
        before = {s.pid: thread_cpu(s.pid) for s in servers}
        load = Load(url, *shape)
        load.run(args.seconds)
        after = {s.pid: thread_cpu(s.pid) for s in servers}
        per_thread: collections.Counter[str] = collections.Counter()
        for s in servers:
            names = thread_names(s.pid)
            for tid, cpu in after[s.pid].items():
                per_thread[names.get(tid, f"thread {tid}")] += cpu - before[s.pid].get(tid, 0.0)
        n = max(load.acked, 1)
        print(f"{args.store}, {replicas} replica(s), {load.acked} pushes acknowledged\n")
        print("| thread | CPU us / push |\n|---|---:|")
        for name, cpu in per_thread.most_common():
            if cpu > 0:
                print(f"| {name} | {1e6 * cpu / n:.0f} |")
        print(f"| all threads | {1e6 * sum(per_thread.values()) / n:.0f} |\n")
        if replicas > 1:
            sent = heard = 0.0
            for s in servers:
                for line in httpx.get(s.url + "/metrics").text.splitlines():
                    if line.startswith("healthsvc_lease_notifications_sent_total"):
                        sent += float(line.rsplit(" ", 1)[1])
                    elif line.startswith("healthsvc_lease_notifications_heard_total"):
                        heard += float(line.rsplit(" ", 1)[1])
            print(f"  notifications sent {sent:,.0f}, heard {heard:,.0f} (warm-up included)")


if __name__ == "__main__":
    main()
