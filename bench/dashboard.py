"""The dashboard's run page for a 16,384-rank x 10,000-step run: payload sizes and load time,
measured in a real headless Chromium (the target: interactive within 2 s).

1. Builds the run (164 M records) by writing columnar chunks of 16 steps x all ranks straight
   through the store API, with the dashboard's rollup hub subscribed exactly as in the service
   (so the rollup is the one the service would have built from the same pushes); a straggler
   (rank 12,345, 2x compute time from step 4,000), a NaN on one rank's loss at step 7,000, a
   checkpoint every 500 steps and the straggler finding are recorded too. (No ``non_finite``
   finding: with a corruption finding, ``GET .../rollback`` pivots the run's whole history for
   the onset estimate, over 10 GB at this size; that is the rollback's own cost, not the page's,
   and the page asks for it only after it is interactive.)
2. Starts ``healthsvc serve`` on that file with detection off (``HEALTHSVC_DETECT=false``: the
   monitor would otherwise replay all 164 M records through the detectors on start; the page
   reads only the rollup and the stored findings either way).
3. Reports the JSON payloads the page fetches (bytes on the wire with gzip, and raw) and their
   server time, then opens ``/runs/{run}`` in Chromium ``--repeats`` times: time from navigation
   start to the page's ready mark (header, findings, both curves and the heatmap drawn).

    .venv/bin/python bench/dashboard.py [--ranks 16384] [--steps 10000] [--repeats 3] [--db PATH] [--screenshot PNG]

Building the run takes about a minute on the shared 2-core machine; ``--db`` reuses a file.
``--smoke`` (the tests): 16 ranks x 64 steps, one page load.
"""
from __future__ import annotations

import argparse
import atexit
import gzip
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from healthsvc_detectors.finding import Finding  # noqa: E402
from healthsvc.dashboard.hub import RollupHub  # noqa: E402
from healthsvc.findings import FindingsService  # noqa: E402
from healthsvc.store.batch import MetricBatch  # noqa: E402
from healthsvc.store.sqlite import SQLiteStore  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402
from tests.dashboard import browser  # noqa: E402

RUN = "frontier-16k"
BLOCK_STEPS = 16


def build(db: str, n_ranks: int, n_steps: int, slow_rank: int, nan_step: int) -> None:
    store = SQLiteStore(f"sqlite:///{db}")
    findings = FindingsService(store, time.time)
    hub = RollupHub(store, snapshot_every_s=1e9)  # one snapshot, at the end
    store.subscribe(hub.committed)                # the service's pipeline feeds it the same way
    store.open()
    hub.start()
    store.control.submit_run_config(RUN, {"world_size": n_ranks}).result()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    ranks = np.tile(np.arange(n_ranks, dtype=np.int64), BLOCK_STEPS)
    for s0 in range(0, n_steps, BLOCK_STEPS):
        k = min(BLOCK_STEPS, n_steps - s0)
        steps = np.repeat(np.arange(s0, s0 + k, dtype=np.int64), n_ranks)
        t = steps.astype(np.float64)
        loss = 2.0 + 8.0 * (1 + t / 300) ** -0.6 * np.exp(0.04 * rng.standard_normal(len(steps)))
        grad = np.repeat(0.6 + 3.0 * np.exp(-np.arange(s0, s0 + k) / 1500)
                         * np.exp(0.1 * rng.standard_normal(k)), n_ranks)
        compute = 0.4 * (1 + 0.02 * rng.standard_normal(len(steps)))
        r = ranks[:len(steps)]
        compute[(r == slow_rank) & (steps >= n_steps * 2 // 5)] *= 2.0
        if s0 <= nan_step < s0 + k:
            loss[(steps == nan_step) & (r == 3)] = np.nan
        step_time = np.repeat(compute.reshape(k, n_ranks).max(axis=1) + 0.08, n_ranks)
        values = {"loss": loss, "grad_norm": grad, "compute_time": compute, "step_time": step_time}
        batch = MetricBatch(steps, r, values, {f: np.ones(len(steps), bool) for f in values})
        store.ingest.submit_metrics(RUN, batch, f"bench-{s0}").result()
        for c in range(-(-s0 // 500) * 500, s0 + k, 500):
            if c:
                store.control.submit_checkpoint(RUN, c, f"s3://ckpt/{RUN}/step{c}", 30.0, 40 * 2**30).result()
    findings.record(RUN, 1, [
        Finding("straggler", step=n_steps * 2 // 5 + 8, ranks=(slow_rank,), severity="critical", metric="compute_time",
                score=1.0, onset_step=n_steps * 2 // 5, evidence={"ratio": 2.0})], {}).result()
    hub.drain(600)
    hub.stop()
    store.close()
    print(f"built {n_ranks:,} ranks x {n_steps:,} steps ({n_ranks * n_steps / 1e6:.0f} M records) "
          f"in {time.perf_counter() - t0:.0f} s; store {os.path.getsize(db) / 2**20:.0f} MiB")


PAYLOADS = [
    ("run header", "/v1/dashboard/runs/{run}"),
    ("findings", "/v1/runs/{run}/findings?limit=5000"),
    ("checkpoints", "/v1/runs/{run}/checkpoints"),
    ("series (loss, grad_norm; 1,000 points)", "/v1/runs/{run}/dashboard/series?fields=loss,grad_norm&points=1000"),
    ("heatmap (compute_time; 400 columns)", "/v1/runs/{run}/dashboard/heatmap?field=compute_time&max_cols=400"),
    ("series, zoomed to 500 steps", "/v1/runs/{run}/dashboard/series?fields=loss,grad_norm&points=1000&step_min=4000&step_max=4499"),
]


def payloads(url: str) -> None:
    print(f"\n| request | on the wire (gzip) | raw JSON | server time |\n|---|---:|---:|---:|")
    with httpx.Client(base_url=url, timeout=120) as http:
        for name, path in PAYLOADS:
            path = path.format(run=RUN)
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                with http.stream("GET", path, headers={"accept-encoding": "gzip"}) as r:
                    wire = b"".join(r.iter_raw())
                best = min(best, time.perf_counter() - t)
                r.raise_for_status()
            raw = gzip.decompress(wire) if r.headers.get("content-encoding") == "gzip" else wire
            print(f"| {name} | {len(wire) / 1024:,.1f} KiB | {len(raw) / 1024:,.1f} KiB | {best * 1e3:.0f} ms |")
        t = time.perf_counter()
        http.get(f"/v1/runs/{RUN}/rollback").raise_for_status()
        print(f"| rollback answer (asked after the page is interactive) | | | {(time.perf_counter() - t) * 1e3:.0f} ms |")


def page_load(url: str, repeats: int, screenshot: str | None = None) -> list[float]:
    why = browser.available()
    if why:
        raise SystemExit(why)
    times = []
    with tempfile.TemporaryDirectory() as profile:
        d = browser.start_browser(Path(profile))
        try:
            for _ in range(repeats):
                d.get("about:blank")
                d.get(f"{url}/runs/{RUN}")
                browser.wait_for(d, "window.dashboard && window.dashboard.ready", timeout_s=60)
                ms = d.execute_script("return window.dashboard.readyMs")  # since navigation start
                heat = d.execute_script("return window.dashboard.heatmap.hottest")
                times.append(ms / 1e3)
            if screenshot:
                browser.wait_for(d, "window.dashboard.slowLoaded", timeout_s=60)
                d.save_screenshot(screenshot)
            errors = browser.console_errors(d)
        finally:
            d.quit()
    print(f"\nrun page ready (header, findings, curves, heatmap drawn) in Chromium, {len(times)} loads "
          f"(target 2 s); heatmap's slowest row: ranks {heat['rank_lo']}-{heat['rank_hi']} ({heat['ratio']}x); "
          f"console errors: {len(errors)}\n")
    print("| page | ready s (median) | fastest s | slowest s |\n|---|---:|---:|---:|")
    print(f"| /runs/{{run}} | {statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f} |")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=16_384)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--db", default=None, help="reuse (or create) this store file")
    ap.add_argument("--screenshot", default=None, help="save the run page as this PNG")
    ap.add_argument("--smoke", action="store_true", help="16 ranks x 64 steps, one load: proves it runs (tests)")
    args = ap.parse_args()
    if args.smoke:
        args.ranks, args.steps, args.repeats = 16, 64, 1
    tmp = tempfile.mkdtemp(prefix="bench-dashboard-")
    if args.db is None:   # a built run is gigabytes; --db keeps one to reuse
        atexit.register(shutil.rmtree, tmp, True)
    db = args.db or os.path.join(tmp, "healthsvc.db")
    if not os.path.exists(db):
        build(db, args.ranks, args.steps, slow_rank=min(12_345, args.ranks - 1), nan_step=args.steps * 7 // 10)
    srv = ServerProcess(db, env={"HEALTHSVC_DETECT": "false"}, log_path=os.path.join(tmp, "server.log"))
    srv.start(timeout_s=300)
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:  # barrier: the rollup is loaded
            browser.poll(lambda: http.get(f"/v1/dashboard/runs/{RUN}").json()["rollup_last_step"] == args.steps - 1,
                         timeout_s=300, what="the rollup restored")
        payloads(srv.url)
        page_load(srv.url, args.repeats, args.screenshot)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
