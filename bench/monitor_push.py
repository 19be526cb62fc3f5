"""The monitor's work for a push on its own: CPU per push of one run's ``RunMonitor``, in process.

In the service the monitor's thread shares the two cores with the event loop, the writer and the
dashboard, and its CPU a push moves with them (``bench/ingest_inproc.py --detect`` reads it per
thread). This feeds committed one-step pushes of every rank (``bench/rollup_fold.py``'s, the
workload of ``bench/ingest.py``) straight to a ``RunMonitor`` on default settings, in this
thread, and divides this thread's CPU time by the pushes: what the detectors and the arrival and
absence checks ask for, without the machine's contention. A second column: the step aligner in
front of the detectors alone (``StepAligner.add``, the blocks it cuts included).

A third column: the same monitor while another thread of the process runs Python without pause
(the worst case of the event loop beside it). numpy releases the GIL for a call on more than 500
values (a detector's work on a block of 16 steps of 64 ranks and up) and must take it back from
the busy thread: on this machine that multiplies the monitor's CPU a push by 1.7 at 64 ranks and
by 5 at 1,024, and by less at one rank, whose arrays are too small to release it. A busy process
beside it instead (the other core as busy, no GIL shared) leaves the first column as it is: what
the third adds is the sharing of one interpreter. It moves with ``sys.setswitchinterval`` (the
wait for the GIL), which the service's figures do not: the event loop waits for its sockets
between requests. In the service the monitor costs about three times the first column at 1,024
ranks (docs/performance.md, stop 48).

    .venv/bin/python bench/monitor_push.py [--steps 1600] [--repeats 3] [--smoke]
    .venv/bin/python bench/ab.py HEAD~1 bench/monitor_push.py --pairs 2 --same bench/rollup_fold.py
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.rollup_fold import pushes  # noqa: E402
from healthsvc.monitor.aligner import StepAligner  # noqa: E402
from healthsvc.monitor.run_monitor import RunMonitor  # noqa: E402

RANKS = (1, 64, 1024)
PUSH_INTERVAL_S = 0.01   # the service clock between two pushes (100 steps a second)


def cpu_per_push(items, feed) -> float:
    """Seconds of this thread's CPU a push, ``feed(push, service clock)`` called for each."""
    t0 = time.thread_time()
    for i, push in enumerate(items):
        feed(push, 1000.0 + i * PUSH_INTERVAL_S)
    return (time.thread_time() - t0) / len(items)


def monitor_cost(items, n_ranks: int) -> float:
    """Through a new run's monitor."""
    mon = RunMonitor("bench", {"world_size": n_ranks})
    return cpu_per_push(items, lambda push, now: mon.on_metrics(push.batch, push.run, push.chunk_id, now))


def beside_busy_python(fn):
    """``fn()`` run in a thread of its own while another thread runs a Python loop, its result."""
    stop, out = threading.Event(), []

    def busy() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    other = threading.Thread(target=busy)
    other.start()
    try:
        worker = threading.Thread(target=lambda: out.append(fn()))
        worker.start()
        worker.join()
    finally:
        stop.set()
        other.join()
    return out[0]


def aligner_cost(items, n_ranks: int) -> float:
    """Through the step aligner alone."""
    aligner = StepAligner()
    return cpu_per_push(items, lambda push, now: aligner.add(push.batch, now, n_ranks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1600, help="steps of the run (one push each)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case; the best is reported")
    ap.add_argument("--smoke", action="store_true", help="a few steps (the tests)")
    args = ap.parse_args()
    steps, repeats = (40, 1) if args.smoke else (args.steps, args.repeats)
    print("| ranks (records / push) | steps | monitor us CPU / push | step aligner us CPU / push "
          "| monitor beside a busy Python thread, us CPU / push |")
    print("|---:|---:|---:|---:|---:|")
    for n_ranks in RANKS:
        items = pushes(n_ranks, steps, seed=n_ranks)
        mon = min(monitor_cost(items, n_ranks) for _ in range(repeats))
        aligner = min(aligner_cost(items, n_ranks) for _ in range(repeats))
        contended = beside_busy_python(lambda: min(monitor_cost(items, n_ranks) for _ in range(repeats)))
        print(f"| {n_ranks:,} | {steps:,} | {mon * 1e6:.1f} | {aligner * 1e6:.1f} | {contended * 1e6:.1f} |")


if __name__ == "__main__":
    main()
