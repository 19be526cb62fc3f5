"""The dashboard's fold on its own: CPU per push of one run's rollup (aligner and rollup), in process.

``bench/ingest_inproc.py`` reads the dashboard thread's CPU from /proc in clock ticks (10 ms),
which at 64-record pushes is a tick or two per hundred pushes: too coarse to see a change of a
fifth of it. This feeds committed pushes straight to a :class:`RunFeed`, grouped as the hub's
queue groups them (``group`` pushes of one run at a time), and divides this thread's CPU time by
the pushes: 4,000 steps of one run, so the rollup's grids grow, and widen past 2,048 steps, as a
long run's do.

    .venv/bin/python bench/rollup_fold.py [--steps 4000] [--repeats 3] [--smoke]
    .venv/bin/python bench/ab.py HEAD bench/rollup_fold.py --pairs 3

A second table: the snapshot of the 1,024-rank run folded last (``RunFeed.to_bytes``, which the
hub writes every ``snapshot_every_s`` for every active run, and its load on a restart).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.ingest import GLOBAL_FIELDS  # noqa: E402
from healthsvc.dashboard.hub import RunFeed  # noqa: E402
from healthsvc.store.batch import MetricBatch  # noqa: E402
from healthsvc.store.results import IngestResult  # noqa: E402
from healthsvc.store.runstate import RunView  # noqa: E402

FIELDS = ("loss", "grad_norm", "local_grad_norm", "step_time", "compute_time", "comm_time")
# (records a push: one step of that many ranks, pushes the hub's thread takes together)
CASES = ((1, 256), (64, 190), (1024, 16))


def pushes(n_ranks: int, n_steps: int, seed: int) -> list[IngestResult]:
    rng = np.random.default_rng(seed)
    out = []
    for step in range(n_steps):
        # A field of GLOBAL_FIELDS (the gradient norm after the all-reduce) is the same on every
        # rank of a step, as bench/ingest.py sends it and a data-parallel job reports it.
        batch = MetricBatch(np.full(n_ranks, step, np.int64), np.arange(n_ranks, dtype=np.int64),
                            {f: 1.0 + 0.1 * rng.standard_normal(1 if f in GLOBAL_FIELDS else n_ranks)
                                * np.ones(n_ranks) for f in FIELDS},
                            {f: np.ones(n_ranks, bool) for f in FIELDS})
        out.append(IngestResult("bench", n_ranks, False, 1, False, step + 1, 0.0, batch,
                                RunView(1, 0, n_ranks, False)))
    return out


def fold_cost(items: list[IngestResult], n_ranks: int, group: int) -> float:
    """Seconds of this thread's CPU a push, folding ``items`` into a new feed."""
    feed = RunFeed(5.0, n_ranks)
    t0 = time.thread_time()
    for i in range(0, len(items), group):
        feed.add_pushes(items[i:i + group])
    feed.flush_all()
    return (time.thread_time() - t0) / len(items)


def snapshot_cost(items: list[IngestResult], n_ranks: int, repeats: int) -> tuple[float, float, int]:
    """(seconds to write the folded run's snapshot, seconds to load it, its bytes), the best of
    ``repeats``: what the hub pays every ``snapshot_every_s`` for each active run."""
    feed = RunFeed(5.0, n_ranks)
    for i in range(0, len(items), 16):
        feed.add_pushes(items[i:i + 16])
    write, load = float("inf"), float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        blob = feed.to_bytes()
        t1 = time.process_time()
        RunFeed(5.0, n_ranks).load_bytes(blob)
        write, load = min(write, t1 - t0), min(load, time.process_time() - t1)
    return write, load, len(blob)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4000, help="steps of the run (one push each)")
    ap.add_argument("--repeats", type=int, default=3, help="folds per case; the best is reported")
    ap.add_argument("--smoke", action="store_true", help="a few steps (the tests)")
    args = ap.parse_args()
    steps, repeats = (40, 1) if args.smoke else (args.steps, args.repeats)
    print("| records / push | pushes / fold | steps | us CPU / push | ns CPU / record |")
    print("|---:|---:|---:|---:|---:|")
    for n_ranks, group in CASES:
        items = pushes(n_ranks, steps, seed=n_ranks)
        best = min(fold_cost(items, n_ranks, group) for _ in range(repeats))
        print(f"| {n_ranks:,} | {group} | {steps:,} | {best * 1e6:.1f} | {best * 1e9 / n_ranks:.0f} |")
    n_ranks = CASES[-1][0]
    write, load, size = snapshot_cost(pushes(n_ranks, steps, seed=n_ranks), n_ranks, max(repeats, 3))
    print("\n| snapshot of the run | ranks | steps | ms CPU to write | ms CPU to load | MB |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| folded above | {n_ranks:,} | {steps:,} | {write * 1e3:.1f} | {load * 1e3:.1f} | {size / 1e6:.2f} |")


if __name__ == "__main__":
    main()
