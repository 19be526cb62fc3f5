"""Instructions a push costs the whole real server, by thread, counted by valgrind: the same on every run.

``bench/ingest.py`` times the real server, and its figures move by 10-20 % between runs of the
same code on a shared machine; ``bench/instructions.py`` counts, but only the store's writer
job. This one counts everything a push costs the server's threads: ``healthsvc serve`` runs
under callgrind (``--separate-threads=yes``) with counting off while it starts and takes a warm-up
of pushes, then on (``callgrind_control``) for ``--pushes`` pushes of ``bench/ingest.py``'s workload
from four clients, one run each, each thread's count divided by the pushes.

    .venv/bin/python bench/server_instructions.py [--cases columns:1,columns:64,rows:64] [--smoke]
    .venv/bin/python bench/ab.py 91dd201 bench/server_instructions.py --pairs 1 --same bench/ingest.py

Threads are named by what they run (callgrind knows threads by number only): the one in libuv's
loop is the event loop; of those that commit to SQLite, the busiest is the store's writer; the
rest (the dashboard's rollups, the per-run series, the ticks, delivery) are summed as "other".
What a count cannot say: the kernel's part (the commit's fsync, the sockets), and waits. Under
valgrind a push takes about fifty times as long, so the work a thread paces by the clock (the
dashboard folds what gathered every 0.5 s) is folded in smaller groups than at full speed, and
its fixed cost per fold weighs more here than it does in ``bench/ingest.py``'s per-thread table.
Needs valgrind (``apt-get install valgrind``).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ingest import make_payload, shape  # noqa: E402  (bench/ingest.py: the same workload)

from healthsvc.local_server import free_port  # noqa: E402

CLIENTS = 4
WARM_UP = 20          # pushes per client before counting starts


def pushes_for(records: int) -> int:
    return max(40, min(400, 400 * 64 // max(records, 64)))


class CountedServer:
    """``healthsvc serve`` on a fresh SQLite file under callgrind, counting off until :meth:`count_on`."""

    def __init__(self, tmp: str) -> None:
        self.out = os.path.join(tmp, "callgrind")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "HEALTHSVC_DETECT": "0"}
        self.log = open(os.path.join(tmp, "server.log"), "w")
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
             f"--callgrind-out-file={self.out}.%p", sys.executable, "-m", "healthsvc", "serve",
             "--db", os.path.join(tmp, "bench.db"), "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "warning"], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server_instructions: the server under valgrind exited {self.proc.returncode}"
                                 f" (its log: {self.log.name})")
            try:
                if httpx.get(self.url + "/readyz", timeout=10).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit("server_instructions: the server under valgrind did not become ready in 300 s")

    def control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True, capture_output=True)

    def count_on(self) -> None:
        self.control("-i", "on")
        self.control("-z")

    def dump(self) -> dict[str, int]:
        """Instructions by thread role since :meth:`count_on`."""
        self.control("-d", "counted")
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        roles: dict[str, int] = {"event loop": 0, "store writer": 0, "other": 0}
        writers = []
        for path in glob.glob(f"{self.out}.{self.proc.pid}.*"):
            with open(path) as f:
                text = f.read()
            if "counted" not in text[:4000]:
                continue   # the dump callgrind writes at exit, after the counted one
            total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
            n = int(total.group(1)) if total else 0
            if re.search(r"^fn=\(\d+\) uv_run$", text, re.M):
                roles["event loop"] += n
            elif re.search(r"^c?fn=\(\d+\) sqlite3_step$", text, re.M):
                writers.append(n)
            else:
                roles["other"] += n
        writers.sort()
        if writers:   # the busiest thread that steps SQLite statements; the rest (delivery's claims) is other
            roles["store writer"] = writers.pop()
            roles["other"] += sum(writers)
        return roles


def push_all(url: str, form: str, records: int, payloads: list[list[bytes]]) -> None:
    errors: list[str] = []

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=600) as c:
            for body in payloads[k]:
                r = c.post(f"/v1/runs/count-{form}-{records}-c{k}/metrics", content=body,
                           headers={"content-type": "application/json"})
                if r.status_code != 202:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                    return

    pool = [threading.Thread(target=client, args=(k,)) for k in range(len(payloads))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise SystemExit(f"server_instructions: a push failed: {errors[0]}")


def count_case(form: str, records: int, pushes: int) -> dict[str, int]:
    rng = np.random.default_rng(records)
    n_steps, _ = shape(records)
    per_client = max(1, pushes // CLIENTS)
    payloads = [[make_payload(form, records, i * n_steps, rng) for i in range(WARM_UP + per_client)]
                for _ in range(CLIENTS)]
    tmp = tempfile.mkdtemp(prefix="server-instructions-")
    try:
        server = CountedServer(tmp)
        try:
            push_all(server.url, form, records, [p[:WARM_UP] for p in payloads])
            server.count_on()
            push_all(server.url, form, records, [p[WARM_UP:] for p in payloads])
            time.sleep(1.0)   # the after-commit stages' share of the last pushes (the dashboard folds every 0.5 s)
            roles = server.dump()
        finally:
            if server.proc.poll() is None:
                server.proc.kill()
        return {role: n // (per_client * CLIENTS) for role, n in roles.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="columns:1,columns:64,columns:1024,rows:1,rows:64,rows:1024",
                    help="form:records, comma-separated")
    ap.add_argument("--pushes", type=int, default=0, help="counted pushes per case (default: 400 at 64 records"
                    " and fewer, 40 at 1,024 and more)")
    ap.add_argument("--smoke", action="store_true", help="a few pushes of one small case (the tests)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("server_instructions: needs valgrind (apt-get install valgrind)")
    cases = [("columns", 8)] if args.smoke else [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    rows = []
    for form, records in cases:
        pushes = 8 if args.smoke else (args.pushes or pushes_for(records))
        t0 = time.perf_counter()
        per_push = count_case(form, records, pushes)
        rows.append((form, records, per_push))
        print(f"  {form} {records:5d} records/push: {sum(per_push.values()):,} instructions a push "
              f"({time.perf_counter() - t0:.0f} s under valgrind)", file=sys.stderr, flush=True)
    print("\n| form | records/push | event loop | store writer | other threads | whole server | per record |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for form, records, p in rows:
        total = sum(p.values())
        print(f"| {form} | {records:,} | {p['event loop']:,} | {p['store writer']:,} | {p['other']:,} | {total:,} "
              f"| {total // records:,} |")
    print("\n(instructions a push, by server thread; valgrind's callgrind, detectors off)")


if __name__ == "__main__":
    main()
