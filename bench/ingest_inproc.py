"""Ingest CPU per push without HTTP or a client: the service's ASGI app driven in this process.

``bench/ingest.py`` times the real server under real clients, which share the machine's two cores
with it: its figures move by 10 % from run to run. This one calls the app that ``healthsvc
serve`` runs (``create_asgi``: the request guard, the ingest fast path, the store, every stage
after it) with pre-serialised pushes from a few concurrent tasks on one event loop (uvloop, as
``serve`` runs), and divides the CPU time of the whole process (every thread) by the pushes. No
socket, no HTTP parser, no client: what is left is what the service itself does with a push,
and runs agree within a few per cent. Each thread's share is named.

``--without dashboard,run_metrics`` leaves features out (their ``install`` is not called), to
see what each costs: that is how the dashboard's rollups were found to be a fifth of a
1,024-record push (docs/performance.md). A tree without such a feature runs whole.

    .venv/bin/python bench/ingest_inproc.py [--pushes 2000] [--without dashboard] [--smoke]
    .venv/bin/python bench/ab.py 91dd201 bench/ingest_inproc.py --pairs 3   # against the last release

``--smoke`` (the tests): a few pushes of each case.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.ingest import make_payload, shape  # noqa: E402

CASES = (("columns", 1), ("columns", 64), ("columns", 1024), ("rows", 64), ("rows", 1024))
CLIENTS = 4      # concurrent pushes (what the group commit sees)
WARM = 16        # pushes per client before the clock starts (the runs exist, caches are warm)


def minor_faults() -> int:
    """Page faults of this process so far that found the page in memory (fresh or returned
    memory touched again: what a heap that grows and shrinks costs)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def thread_cpu() -> dict[str, float]:
    """CPU-seconds of each thread of this process, by thread name (pool threads summed)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            continue
        name = t.name.rstrip("0123456789").rstrip("-_") or t.name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class App:
    """The served ASGI app, started (lifespan) and stopped in this process."""

    def __init__(self, db: str, without: set[str]) -> None:
        os.environ["HEALTHSVC_DB"] = db
        import healthsvc.app as app_module
        for feature in without:
            if hasattr(app_module, feature):   # an older tree may not have it
                getattr(app_module, feature).install = lambda app, ctx: None
        from healthsvc.settings import Settings
        settings = Settings()
        if hasattr(settings, "malloc_arena_max"):   # what `healthsvc serve` does before the app's
            from healthsvc.ops import allocator       # threads start, where the tree does it
            allocator.tune(settings.malloc_arena_max)
        self.app = app_module.create_asgi(settings)
        import healthsvc.cli as cli   # ... and after building the app, the collector as serve sets it
        if hasattr(cli, "tune_gc_for_serving"):
            cli.tune_gc_for_serving()
        else:                         # an older tree (healthsvc.cli._freeze_startup_objects)
            gc.collect()
            gc.freeze()
        self._messages: asyncio.Queue = asyncio.Queue()

    async def start(self) -> None:
        async def receive():
            return await self._messages.get()

        async def send(message):
            if message["type"] == "lifespan.startup.failed":
                raise RuntimeError(message.get("message"))

        self._lifespan = asyncio.ensure_future(self.app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                                        receive, send))
        await self._messages.put({"type": "lifespan.startup"})
        await asyncio.sleep(0.5)

    async def stop(self) -> None:
        await self._messages.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(self._lifespan, 30)

    async def push(self, run_id: str, body: bytes) -> None:
        received = False
        status: list[int] = []

        async def receive():
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()   # the client never disconnects

        async def send(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])

        path = f"/v1/runs/{run_id}/metrics"
        await self.app({"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
                        "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": "",
                        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())],
                        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080), "state": {}},
                       receive, send)
        if status != [202]:
            raise RuntimeError(f"push to {run_id} answered {status}")


async def run_case(app: App, form: str, n_records: int, pushes: int) -> dict:
    rng = np.random.default_rng(n_records)
    n_steps, _ = shape(n_records)
    per_client = max(1, pushes // CLIENTS)
    bodies = [[make_payload(form, n_records, i * n_steps, rng) for i in range(WARM + per_client)]
              for _ in range(CLIENTS)]

    async def client(k: int, part: slice) -> None:
        for body in bodies[k][part]:
            await app.push(f"inproc-{form}-{n_records}-c{k}", body)

    await asyncio.gather(*(client(k, slice(0, WARM)) for k in range(CLIENTS)))
    await asyncio.sleep(0.6)   # the stages catch up with the warm-up
    threads0, cpu0, faults0 = thread_cpu(), time.process_time(), minor_faults()
    await asyncio.gather(*(client(k, slice(WARM, None)) for k in range(CLIENTS)))
    await asyncio.sleep(0.6)   # ... and with what the timed pushes caused (folds wait up to 0.5 s)
    cpu, threads1, faults = time.process_time() - cpu0, thread_cpu(), minor_faults() - faults0
    done = CLIENTS * per_client
    per_thread = {name: (t - threads0.get(name, 0.0)) * 1e3 / done for name, t in threads1.items()}
    return {"form": form, "records": n_records, "pushes": done, "ms_per_push": cpu * 1e3 / done,
            "points_per_cpu_s": done * n_records * 6 / cpu, "faults_per_push": faults / done,
            "threads": {n: v for n, v in sorted(per_thread.items(), key=lambda kv: -kv[1]) if v > 0.0005}}


async def main_async(args: argparse.Namespace, db: str) -> list[dict]:
    app = App(db, set(filter(None, args.without.split(","))))
    await app.start()
    try:
        rows = []
        for form, n in CASES:
            pushes = 8 if args.smoke else max(CLIENTS, min(args.pushes, int(args.points / (n * 6)) or CLIENTS))
            rows.append(await run_case(app, form, n, pushes))
            print(f"  {form:8s} {n:5d} records/push: {rows[-1]['ms_per_push']:.3f} ms CPU/push", file=sys.stderr)
        return rows
    finally:
        await app.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pushes", type=int, default=2000, help="timed pushes per case, at most")
    ap.add_argument("--points", type=float, default=4e6, help="timed metric points per case, at most")
    ap.add_argument("--without", default="", help="features left out, comma-separated (dashboard, run_metrics, ...)")
    ap.add_argument("--detect", action="store_true", help="run the detectors too (off by default: ingest alone)")
    ap.add_argument("--smoke", action="store_true", help="a few pushes per case (the tests)")
    args = ap.parse_args()
    os.environ["HEALTHSVC_DETECT"] = "1" if args.detect else "0"
    tmp = tempfile.mkdtemp(prefix="ingest-inproc-")
    try:
        import uvloop
        rows = uvloop.run(main_async(args, os.path.join(tmp, "inproc.db")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    service = "ingest" + (" + detectors" if args.detect else "") + (f", without {args.without}" if args.without else "")
    print("\n| form | records/push | service | pushes | ms CPU / push | M points / CPU-s | page faults / push |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['form']} | {r['records']:,} | {service} | {r['pushes']:,} | {r['ms_per_push']:.3f} | "
              f"{r['points_per_cpu_s'] / 1e6:.2f} | {r['faults_per_push']:.1f} |")
    print("\n| form | records/push | thread | ms CPU / push |")
    print("|---|---:|---|---:|")
    for r in rows:
        for name, ms in r["threads"].items():
            print(f"| {r['form']} | {r['records']:,} | {name} | {ms:.3f} |")
    print(f"\n({CLIENTS} concurrent pushes on one event loop, in process; every push durable: WAL, synchronous=FULL)")


if __name__ == "__main__":
    main()
