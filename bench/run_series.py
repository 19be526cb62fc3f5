"""The per-run series on ``/metrics`` on their own: CPU per push of their fold, in process.

The series fed per push (``healthsvc.run_metrics``: the step-time window and the ranks' newest
timings; the steps-trained counter is read from the store at scrape time) take every committed
push on the store's writer thread, so what they cost a push the writer pays. This feeds them committed pushes of four runs, three pushes a group
commit as the writer hands them on, and divides this thread's CPU time by the pushes, for each
part and for both together.

    .venv/bin/python bench/run_series.py [--pushes 3000] [--repeats 3] [--smoke]
    .venv/bin/python bench/ab.py HEAD bench/run_series.py --pairs 3
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from healthsvc.run_metrics import RankTimes, StepTimes  # noqa: E402
from healthsvc.run_metrics.feed import new_batches  # noqa: E402
from healthsvc.store.batch import MetricBatch  # noqa: E402
from healthsvc.store.results import IngestResult  # noqa: E402
from healthsvc.store.runstate import RunView  # noqa: E402

FIELDS = ("loss", "grad_norm", "local_grad_norm", "step_time", "compute_time", "comm_time")
RUNS = 4
PER_COMMIT = 3


def pushes(n_ranks: int, n: int, seed: int) -> list[IngestResult]:
    """``n`` pushes, one step of ``n_ranks`` ranks each, round robin over the runs."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        step = i // RUNS
        batch = MetricBatch(np.full(n_ranks, step, np.int64), np.arange(n_ranks, dtype=np.int64),
                            {f: 1.0 + 0.1 * rng.standard_normal(n_ranks) for f in FIELDS},
                            {f: np.ones(n_ranks, bool) for f in FIELDS})
        out.append(IngestResult(f"run{i % RUNS}", n_ranks, False, 1, step == 0, i + 1, 0.0, batch,
                                RunView(1, 0, n_ranks, False)))
    return out


def cost(parts: list, items: list[IngestResult]) -> float:
    """Seconds of this thread's CPU a push, the parts fed every group commit's results."""
    t0 = time.thread_time()
    for i in range(0, len(items), PER_COMMIT):
        group = items[i:i + PER_COMMIT]
        pushes = list(new_batches(group))    # once a group commit, as RunSeries.committed does
        for part in parts:
            if hasattr(part, "add"):
                part.add(pushes)
            else:                            # a tree from before stop 40 (bench/ab.py)
                part.on_store_results(group)
    return (time.thread_time() - t0) / len(items)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pushes", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3, help="feeds per case; the best is reported")
    ap.add_argument("--smoke", action="store_true", help="a few pushes (the tests)")
    args = ap.parse_args()
    n_pushes, repeats = (24, 1) if args.smoke else (args.pushes, args.repeats)
    print("| records / push | series | pushes | us CPU / push |")
    print("|---:|---|---:|---:|")
    for n_ranks in (1, 64, 1024):
        items = pushes(n_ranks, n_pushes, seed=n_ranks)
        # (The steps-trained counter is read from the store's attempts at scrape time: nothing per push.)
        for name, make in (("step times", lambda: [StepTimes()]), ("rank times", lambda: [RankTimes()]),
                           ("every series fed per push", lambda: [StepTimes(), RankTimes()])):
            best = min(cost(make(), items) for _ in range(repeats))
            print(f"| {n_ranks:,} | {name} | {n_pushes:,} | {best * 1e6:.1f} |")


if __name__ == "__main__":
    main()
