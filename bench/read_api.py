"""The analyst read API: 1 M points into pandas through the real service.

Starts ``healthsvc serve`` on a fresh SQLite file, fills a run with a synthetic history (1,024
ranks, four metrics, some NaN and some missing values), then times ``healthsvc_client.read.metrics`` for:

- 1 M points = 250 k (step, rank) rows x 4 metrics (the target: <= 0.5 s), and
- 1 M rows x 4 metrics (4 M points),

each over Arrow (the default) and CSV, next to baselines measured in the same run: the HTTP
transfer alone (same request, bytes discarded) and decoding the same Arrow bytes from memory into
the same DataFrame. Best of ``--repeats`` runs.

    .venv/bin/python bench/read_api.py [--repeats 5] [--smoke]

``--smoke`` (the tests): 1,024 and 4,096 rows, one repeat.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import urllib.request

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from healthsvc_client import read  # noqa: E402
from healthsvc_client.read import _arrow_to_frame  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402

FIELDS = ("loss", "grad_norm", "step_time", "compute_time")
RANKS = 1024
STEPS_PER_REQUEST = 48


def fill(url: str, run_id: str, n_rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    steps = n_rows // RANKS
    with httpx.Client(base_url=url, timeout=120) as http:
        for s0 in range(0, steps, STEPS_PER_REQUEST):
            s1 = min(steps, s0 + STEPS_PER_REQUEST)
            step = np.repeat(np.arange(s0, s1), RANKS)
            rank = np.tile(np.arange(RANKS), s1 - s0)
            cols: dict[str, list] = {"step": step.tolist(), "rank": rank.tolist()}
            for f in FIELDS:
                v = rng.lognormal(0.0, 0.3, len(step)).astype(object)
                v[rng.random(len(step)) < 0.001] = "NaN"
                v[rng.random(len(step)) < 0.001] = None
                cols[f] = v.tolist()
            r = http.post(f"/v1/runs/{run_id}/metrics", json={"columns": cols})
            r.raise_for_status()


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny runs, one repeat: proves it runs (tests)")
    args = parser.parse_args()
    sizes = (1_024, 4_096) if args.smoke else (250_000, 1_000_000)
    if args.smoke:
        args.repeats = 1
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(os.path.join(tmp, "bench.db")) as server:
        reader = read.Reader(server.url)
        cases = [(f"{n * len(FIELDS) / 1e6:g}M points ({n:,} rows x {len(FIELDS)})", f"bench-{n}", n) for n in sizes]
        t0 = time.perf_counter()
        for _, run_id, n in cases:
            fill(server.url, run_id, n)
        print(f"filled in {time.perf_counter() - t0:.1f} s (not part of the figures)")
        print("\n| case | path | seconds | points/s | x baseline |\n|---|---|---:|---:|---:|")
        bodies = []
        for label, run_id, n in cases:
            points = (n // RANKS) * RANKS * len(FIELDS)
            url = f"{server.url}/v1/runs/{run_id}/metrics?format=arrow"
            body = urllib.request.urlopen(url).read()
            assert len(reader.metrics(run_id)) == points // len(FIELDS)
            t_decode = best(lambda: _arrow_to_frame(body), args.repeats)
            t_http = best(lambda: urllib.request.urlopen(url).read(), args.repeats)
            t_arrow = best(lambda: reader.metrics(run_id), args.repeats)
            t_csv = best(lambda: reader.metrics(run_id, format="csv"), max(1, args.repeats // 2))
            rows = [("baseline: Arrow bytes in memory -> DataFrame", t_decode),
                    ("baseline: HTTP transfer only (Arrow)", t_http),
                    ("read.metrics (Arrow over HTTP)", t_arrow),
                    ("read.metrics (CSV over HTTP)", t_csv)]
            for path, t in rows:
                print(f"| {label} | {path} | {t:.3f} | {points / t:,.0f} | {t / t_decode:.1f} |")
            bodies.append(f"{label}: Arrow body {len(body) / 1e6:.1f} MB")
        print("\n" + "\n".join(bodies))


if __name__ == "__main__":
    main()
