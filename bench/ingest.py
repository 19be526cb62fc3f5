"""Ingest throughput of the real server, per wall second and per server CPU-second.

Starts ``healthsvc serve`` on a fresh SQLite file, pushes pre-serialised batches from client
threads (rows and columns; 1, 64, 1,024 and 16,384 records per request; six metric points per
record), and reads the server's CPU time from /proc. Next to each row: the raw decode of the same
payloads (``orjson.loads``) measured in the same run, so figures can be compared across noisy
machines as ratios. Then: bytes per stored point, and reading 1 M points back into numpy (store
API, in process) and into pandas (CSV over HTTP).

    .venv/bin/python bench/ingest.py [--seconds 4] [--threads 4] [--smoke]

``--smoke`` (the tests): every case at tiny sizes (at most 64 records a request, 0.1 s each).

A second table says where each case's server CPU went: each thread's CPU per acknowledged
request (named with ``py-spy dump`` when py-spy is installed, ``pip install py-spy``).
"""
from __future__ import annotations

import argparse
import atexit
import io
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
import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    from tests.server_process import ServerProcess, free_port  # noqa: E402
except ImportError:  # a tree from before tests/server_process.py (bench/ab.py runs this script on it)
    from healthsvc.testing import ServerProcess, free_port  # type: ignore[no-redef]  # noqa: E402

FIELDS = ("loss", "grad_norm", "local_grad_norm", "step_time", "compute_time", "comm_time")
RANKS_PER_STEP = 1024
# The fields a healthy data-parallel job reports the same on every rank of a step: the gradient
# norm is taken after the all-reduce. Random per rank, every step of every run is replicas that
# disagree on it (``rank_outlier``'s corruption signal, rightly: critical from the first steps),
# and the rows with the detectors on measured a run under a corruption alarm, its findings' and
# pages' writes, not the detectors watching a training (changed in stop 40; see
# docs/performance.md).
GLOBAL_FIELDS = ("grad_norm",)


def shape(n_records: int) -> tuple[int, int]:
    """(steps, ranks) per request: one step of up to 1,024 ranks, more steps beyond that."""
    ranks = min(n_records, RANKS_PER_STEP)
    return n_records // ranks, ranks


def make_payload(form: str, n_records: int, first_step: int, rng: np.random.Generator) -> bytes:
    n_steps, n_ranks = shape(n_records)
    steps = np.repeat(np.arange(first_step, first_step + n_steps), n_ranks)
    ranks = np.tile(np.arange(n_ranks), n_steps)
    cols = {"step": steps.tolist(), "rank": ranks.tolist()}
    for f in FIELDS:
        if f in GLOBAL_FIELDS:   # one value a step, the same on every rank
            cols[f] = np.repeat(1.0 + 0.1 * rng.standard_normal(n_steps), n_ranks).tolist()
        else:
            cols[f] = (1.0 + 0.1 * rng.standard_normal(n_records)).tolist()
    if form == "columns":
        return orjson.dumps({"columns": cols})
    keys = list(cols)
    records = [dict(zip(keys, vals)) for vals in zip(*cols.values())]
    return orjson.dumps({"records": records})


def run_case(server: ServerProcess, form: str, n_records: int, seconds: float, threads: int,
             max_payloads: int = 4000) -> dict:
    """Push one case from ``threads`` clients; each client is a job of its own (run
    ``bench-{form}-{n}-c{k}``) and sends its steps in order, as a trainer's ranks do. (Clients
    sharing one run would deliver its steps out of order, and a step a rank already reported is
    a restart (DESIGN.md): the case would measure a restart every few pushes.)"""
    rng = np.random.default_rng(n_records)
    n_steps, _ = shape(n_records)
    run_id = f"bench-{form}-{n_records}"
    # Enough distinct payloads for the time budget (each has its own steps: no duplicates).
    n_payloads = min(max_payloads, max(32, min(4000, int(600_000 / n_records))))
    per_client = max(1, n_payloads // threads)
    payloads = [[make_payload(form, n_records, i * n_steps, rng) for i in range(per_client)] for _ in range(threads)]
    t0 = time.process_time()
    for p in payloads[0]:
        orjson.loads(p)
    decode_s = (time.process_time() - t0) / len(payloads[0])
    queues = [iter(ps) for ps in payloads]

    def request(client: httpx.Client, k: int) -> bool | None:
        body = next(queues[k], None)
        if body is None:
            return None  # out of payloads: this client is done
        r = client.post(f"/v1/runs/{run_id}-c{k}/metrics", content=body, headers={"content-type": "application/json"})
        return r.status_code == 202

    threads_before = thread_cpu(server.pid)
    ok, errors, wall, cpu = load(server, request, seconds, threads)
    points = ok * n_records * len(FIELDS)
    return {"form": form, "records": n_records, "requests": ok, "errors": errors, "run_id": f"{run_id}-c0",
            "threads": per_thread(server, threads_before, ok),
            "points_per_wall_s": points / wall, "points_per_cpu_s": points / cpu,
            "requests_per_cpu_s": ok / cpu,
            "decode_points_per_cpu_s": n_records * len(FIELDS) / decode_s}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds (user + system) of each thread of a process, by thread id, from /proc."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_names(pid: int) -> dict[str, str]:
    """Thread id -> Python thread name (``py-spy dump``; thread ids alone without py-spy)."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return {}
    dump = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r'Thread (\d+) \([^)]*\): "([^"]+)"', dump)}


def per_thread(server: ServerProcess, before: dict[str, float], requests: int) -> dict[str, float]:
    """ms of CPU per acknowledged request of each named server thread since ``before``."""
    after = thread_cpu(server.pid)
    return by_thread_name(server.pid, {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}, requests)


def by_thread_name(pid: int, cpu_s: dict[str, float], requests: int) -> dict[str, float]:
    """``cpu_s`` (CPU-seconds by thread id) as ms per request by thread name, pool threads as one,
    busiest first."""
    names = thread_names(pid)
    out: dict[str, float] = {}
    for tid, cpu in cpu_s.items():
        name = re.sub(r"[-_]?\d+$", "", names.get(tid, f"thread {tid}"))   # pool threads as one
        out[name] = out.get(name, 0.0) + cpu * 1e3 / max(requests, 1)
    return {n: v for n, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def load(server: ServerProcess, request, seconds: float, threads: int) -> tuple[int, int, float, float]:
    """Run ``request(client, k) -> ok | None (stop)`` from client threads ``k`` for ``seconds``.

    Returns (ok requests, failed requests, wall seconds, server CPU seconds)."""
    lock = threading.Lock()
    counts = {True: 0, False: 0}
    stop = threading.Event()

    def worker(k: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            # At least one request each, however short the case: on a loaded machine a thread may
            # start after a 0.1 s case is over, and a case of no request has no figure.
            while True:
                ok = request(client, k)
                if ok is None:
                    return
                with lock:
                    counts[ok] += 1
                if stop.is_set():
                    return

    cpu0, wall0 = server.cpu_seconds(), time.perf_counter()
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    deadline = wall0 + seconds
    for t in pool:  # until the time is up, or every client ran out of work
        t.join(max(0.0, deadline - time.perf_counter()))
    stop.set()
    for t in pool:
        t.join()
    return counts[True], counts[False], time.perf_counter() - wall0, max(server.cpu_seconds() - cpu0, 1e-9)


def floor_case(server: ServerProcess, seconds: float, threads: int) -> float:
    """Requests per server CPU-second of GET /healthz: what the HTTP stack costs doing nothing."""
    ok, _, _, cpu = load(server, lambda client, k: client.get("/healthz").status_code == 200, seconds, threads)
    return ok / cpu


class BareASGI:
    """uvicorn serving ``bench/bare_asgi.py``: the floor of any Python ASGI service here."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "bare_asgi:app", "--app-dir", os.path.dirname(os.path.abspath(__file__)),
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning", "--no-access-log"])
        self.pid = self.proc.pid
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/healthz", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError("bare uvicorn did not start")

    cpu_seconds = ServerProcess.cpu_seconds  # the same /proc reading, by pid

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def read_back(db_path: str, server: ServerProcess, run_id: str) -> dict:
    from healthsvc.history import load_history
    from healthsvc.store.sqlite import SQLiteStore
    import pandas as pd

    store = SQLiteStore(db_path)
    store.open()
    try:
        t0 = time.perf_counter()
        hist = load_history(store, run_id)
        numpy_s = time.perf_counter() - t0
        points = int(sum(p.sum() for p in hist.present.values()))
    finally:
        store.close()
    t0 = time.perf_counter()
    with httpx.Client(base_url=server.url, timeout=120) as client:
        text = client.get(f"/v1/runs/{run_id}/metrics", params={"format": "csv"}).content
    frame = pd.read_csv(io.BytesIO(text))
    csv_s = time.perf_counter() - t0
    assert len(frame) == len(hist)
    import pyarrow.ipc as ipc
    t0 = time.perf_counter()
    with httpx.Client(base_url=server.url, timeout=120) as client:
        data = client.get(f"/v1/runs/{run_id}/metrics", params={"format": "arrow"}).content
    frame = ipc.open_stream(data).read_pandas()
    arrow_s = time.perf_counter() - t0
    assert len(frame) == len(hist)
    return {"points": points, "numpy_s": numpy_s, "pandas_csv_http_s": csv_s, "pandas_arrow_http_s": arrow_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="load duration per case")
    ap.add_argument("--threads", type=int, default=4, help="client threads (concurrent requests)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, 0.1 s per case: proves it runs (tests)")
    args = ap.parse_args()
    sizes, wide, big_seconds, payloads = (1, 64, 1024, 16384), 1024, 6.0, 4000
    if args.smoke:
        sizes, wide, big_seconds, payloads = (1, 64), 64, 0.1, 100
        args.seconds, args.threads = 0.1, 2
    tmp = tempfile.mkdtemp(prefix="healthsvc-bench-")
    atexit.register(shutil.rmtree, tmp, True)   # three stores of up to ~100 MB each
    db = os.path.join(tmp, "bench.db")
    rows = []
    # What uvicorn alone costs per request (no framework, no work): the ceiling of this stack.
    bare = BareASGI()
    try:
        bare_floor = floor_case(bare, args.seconds, args.threads)
    finally:
        bare.stop()
    # Ingest alone (decode + durable store), as the foundation's targets are stated.
    server = ServerProcess(db, env={"HEALTHSVC_DETECT": "0"})
    server.start()
    try:
        floor = floor_case(server, args.seconds, args.threads)
        for form in ("columns", "rows"):
            for n in sizes:
                res = run_case(server, form, n, args.seconds, args.threads, payloads)
                res["service"] = "ingest"
                rows.append(res)
                print(f"  {form:7s} {n:6d} records/request: {res['points_per_cpu_s'] / 1e6:6.2f} M points/CPU-s,"
                      f" {res['requests_per_cpu_s']:8.0f} req/CPU-s", file=sys.stderr, flush=True)
        # A run of >= 1 M points to read back.
        big = run_case(server, "columns", sizes[-1], big_seconds, args.threads, payloads)
        read = read_back(db, server, big["run_id"])
    finally:
        server.stop()
    total_points = sum(r["requests"] * r["records"] * len(FIELDS) for r in rows) + \
        big["requests"] * big["records"] * len(FIELDS)
    size = sum(os.path.getsize(db + s) for s in ("", "-wal") if os.path.exists(db + s))
    # The same pushes through the documented FastAPI route, without the ASGI fast path.
    server = ServerProcess(os.path.join(tmp, "slow.db"), env={"HEALTHSVC_DETECT": "0", "HEALTHSVC_INGEST_FAST_PATH": "0"})
    server.start()
    try:
        for form, n in (("columns", 1), ("columns", wide)):
            res = run_case(server, form, n, args.seconds, args.threads, payloads)
            res["service"] = "ingest, fast path off"
            rows.append(res)
    finally:
        server.stop()
    # The same service with every detector running on what it ingests.
    server = ServerProcess(os.path.join(tmp, "detect.db"))
    server.start()
    try:
        for form, n in (("columns", 1), ("columns", wide), ("rows", wide)):
            res = run_case(server, form, n, args.seconds, args.threads, payloads)
            res["service"] = "ingest + detectors"
            rows.append(res)
    finally:
        server.stop()

    # The floors as a table, so bench/ab.py ratios them too. The bare app is the same on both
    # trees of an A/B (this venv's uvicorn, a few lines of bench/bare_asgi.py): its B / A says how
    # far the machine alone moved the runs. /healthz goes through each tree's own app.
    print("\n| floor | requests / server CPU-s |\n|---|---:|")
    print(f"| bare uvicorn ASGI app | {bare_floor:,.0f} |")
    print(f"| GET /healthz through FastAPI | {floor:,.0f} |")
    print("\n| form | records/request | service | requests | M points / wall-s | M points / server CPU-s "
          "| requests / server CPU-s | raw decode M points / CPU-s | ingest ÷ decode |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['form']} | {r['records']:,} | {r['service']} | {r['requests']:,} | {r['points_per_wall_s'] / 1e6:.2f} "
              f"| {r['points_per_cpu_s'] / 1e6:.2f} | {r['requests_per_cpu_s']:,.0f} "
              f"| {r['decode_points_per_cpu_s'] / 1e6:.1f} | {r['points_per_cpu_s'] / r['decode_points_per_cpu_s']:.2f} |")
    # Where a request's CPU goes: each server thread's CPU over the case (thread names from
    # py-spy when it is installed), per acknowledged request. Threads a case's pushes caused
    # late (a detector backlog still being worked off when the case ended) are not all counted.
    print("\n| form | records/request | service | thread | ms CPU / request |")
    print("|---|---:|---|---|---:|")
    for r in rows:
        for name, ms in r["threads"].items():
            print(f"| {r['form']} | {r['records']:,} | {r['service']} | {name} | {ms:.3f} |")
    print(f"\nstorage: {size / total_points:.2f} bytes per point ({total_points:,} points, {size / 1e6:.1f} MB file)")
    print(f"read back {read['points']:,} points: {read['numpy_s']:.3f} s into numpy (store API), "
          f"{read['pandas_csv_http_s']:.3f} s into pandas (CSV over HTTP), "
          f"{read['pandas_arrow_http_s']:.3f} s into pandas (Arrow over HTTP)")
    print(f"(machine: {os.cpu_count()} cores shared by client and server; {args.threads} client threads, "
          f"{args.seconds:.0f} s per case; every request durable: WAL, synchronous=FULL)")


if __name__ == "__main__":
    main()
