"""Time the onset estimate over 1 M steps, and print the rollback accuracy table.

Timing: a 1,000,000-step history (a decaying log-normal loss and a gradient norm) with
(a) a gradient burst 200 steps before the end (abrupt), (b) a slow loss drift that began 20,000
steps before the end (gradual: the analysis windows widen over much of the history), and (c) the
same as (a) with an 8-rank ``local_grad_norm`` block and one corrupted rank (the per-rank path).
Each is timed best-of-``--repeats``; the baseline measured in the same run is one ``np.cumsum``
over the same arrays (the cheapest O(n) pass there is), printed as a ratio. Target (issue 4):
<= 1 s per estimate for 1 M steps.

Accuracy: the seeded evaluation of ``tests/detectors/test_rollback_eval.py`` (kind x magnitude x
checkpoint interval -> clean, newest clean, onset in interval, median onset error, steps lost).

    .venv/bin/python bench/onset.py              # timing and table (about 30 s)
    .venv/bin/python bench/onset.py --seeds 16   # a larger evaluation
    .venv/bin/python bench/onset.py --smoke      # 50,000 steps, one seed, 3 kinds, 1 interval (tests)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from healthsvc_detectors.frame import StepBlock  # noqa: E402
from healthsvc_detectors.offline.onset import estimate_onset  # noqa: E402
from tests.detectors.test_rollback_eval import (INTERVALS, KINDS, accuracy_table,  # noqa: E402
                                                evaluate, format_table)

N_STEPS = 1_000_000


def history(kind: str, seed: int = 0, n_steps: int = N_STEPS):
    rng = np.random.default_rng(seed)
    steps = np.arange(1, n_steps + 1, dtype=np.int64)
    log_loss = np.log(3.0) - 0.1 * np.log(steps) + rng.normal(0, 0.02, n_steps)
    log_grad = rng.normal(0, 0.1, n_steps)
    per_rank = None
    if kind == "burst":
        log_grad[-200:] += np.log(20)
        log_loss[-199:] += 0.3
    elif kind == "drift":
        log_loss[-20_000:] += 5e-6 * np.arange(20_000)
    elif kind == "per_rank":
        log_grad[-200:] += np.log(20)
        local = log_grad[:, None] + rng.normal(0, 0.08, (n_steps, 8))
        local[-300:, 5] += np.log(2.0)
        per_rank = StepBlock.from_dense(steps, np.arange(8), local_grad_norm=np.exp(local))
    return steps, np.exp(log_loss), np.exp(log_grad), per_rank


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--smoke", action="store_true", help="50,000 steps, one seed: proves it runs (tests)")
    args = ap.parse_args()
    n_steps, kinds, intervals = N_STEPS, KINDS, INTERVALS
    if args.smoke:
        n_steps, kinds, intervals, args.seeds, args.repeats = 50_000, ("nan", "burst", "clean"), (200,), 1, 1

    print(f"## Onset estimate over {n_steps:,} steps\n")
    print("| history | estimate s | steps/s | x np.cumsum | onset (low..high) | signals |")
    print("|---|---:|---:|---:|---|---|")
    for kind in ("burst", "drift", "per_rank"):
        steps, loss, grad, per_rank = history(kind, n_steps=n_steps)
        baseline = best_of(lambda: (np.cumsum(loss), np.cumsum(grad)), args.repeats)
        if per_rank is not None:
            v = per_rank.values["local_grad_norm"]
            baseline = best_of(lambda: (np.cumsum(loss), np.cumsum(grad), np.cumsum(v, axis=0)),
                               args.repeats)
        result = {}

        def run():
            result["est"] = estimate_onset(steps, loss=loss, grad_norm=grad, per_rank=per_rank)
        seconds = best_of(run, args.repeats)
        est = result["est"]
        where = "none" if est is None else f"{est.step} ({est.low}..{est.high})"
        used = "" if est is None else ", ".join(est.signals_used)
        print(f"| {kind} | {seconds:.3f} | {n_steps / seconds:,.0f} | {seconds / baseline:.0f} "
              f"| {where} | {used} |")

    print(f"\n## Rollback accuracy ({args.seeds} seeds per cell)\n")
    t0 = time.perf_counter()
    outcomes = evaluate(seeds=range(args.seeds), kinds=kinds, intervals=intervals)
    # The shared formatter aligns every column left; its figures are right-aligned here, so that
    # they count as figures (bench/tables.py: the first three columns name the row).
    table = format_table(accuracy_table(outcomes)).splitlines()
    table[1] = "|---|---|---|" + "---:|" * 7
    print("\n".join(table))
    print(f"\n({len(outcomes)} decisions in {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
