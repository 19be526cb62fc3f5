"""A run's detector-state snapshot: what the run's owner pays to write it, and a restart to load it.

The monitor writes each run's detector state every ``snapshot_every_s`` (5 s) on the thread that
runs its detectors (``MonitorHub._snapshot``: ``RunMonitor.state_dict``, its text, compressed),
and the store's writer stores it; a restart or a takeover loads it. For a run at 1 step a second
this is most of what watching it costs. This feeds a run's monitor, as the service builds it
(every detector at its defaults), ``--steps`` steps of a clean synchronous run of each size
(``bench/detectors.py``'s run, one push of all ranks a step), then times the snapshot's writing
and its loading (CPU time of this thread, the best of ``--repeats``) and prints its size.

    .venv/bin/python bench/monitor_snapshot.py [--ranks 8,1024,16384] [--steps 300] [--repeats 5]
    .venv/bin/python bench/ab.py HEAD bench/monitor_snapshot.py --pairs 2
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# bench/detectors.py's synthetic run (loaded by its path: the repository's detectors/ package
# has the same name)
_spec = importlib.util.spec_from_file_location("bench_detectors", os.path.join(os.path.dirname(os.path.abspath(__file__)), "detectors.py"))
assert _spec is not None and _spec.loader is not None
_bench_detectors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench_detectors)
make_block = _bench_detectors.make_block

# A tree from before these (bench/ab.py runs this script on one) stored the text, read by json.
try:
    from healthsvc.monitor.hub import _snapshot_blob  # noqa: E402
except ImportError:
    from healthsvc.monitor.hub import _dump_state as _snapshot_blob  # noqa: E402
try:
    from healthsvc.monitor.hub import _load_state  # noqa: E402
except ImportError:
    from json import loads as _load_state  # type: ignore[assignment]  # noqa: E402
from healthsvc.monitor.run_monitor import RunMonitor  # noqa: E402
from healthsvc.store import codec  # noqa: E402,F401  (as in the server: blosc2 on one thread)
from healthsvc.store.batch import MetricBatch  # noqa: E402
from healthsvc.store.runstate import RunView  # noqa: E402


def fed_monitor(n_ranks: int, n_steps: int) -> RunMonitor:
    block = make_block(n_steps, n_ranks, seed=n_ranks)
    mon = RunMonitor("bench", {"world_size": n_ranks})
    run = RunView(1, 0, n_ranks, False)
    ranks = np.arange(n_ranks, dtype=np.int64)
    for i in range(n_steps):
        values = {f: np.ascontiguousarray(v[i], dtype=np.float64) for f, v in block.values.items()}
        batch = MetricBatch(np.full(n_ranks, i, np.int64), ranks, values,
                            {f: np.ones(n_ranks, bool) for f in values})
        mon.on_metrics(batch, run, i + 1, 1000.0 + i)
    return mon


def snapshot_costs(mon: RunMonitor, n_ranks: int, repeats: int) -> tuple[float, float, int]:
    """(CPU seconds to make the snapshot's blob, to load it into a new monitor, its bytes as stored)."""
    write = load = float("inf")
    blob = b""
    for _ in range(repeats):
        t0 = time.process_time()
        blob = _snapshot_blob(mon.state_dict())
        t1 = time.process_time()
        RunMonitor("bench", {"world_size": n_ranks}).load_state_dict(_load_state(blob))
        write, load = min(write, t1 - t0), min(load, time.process_time() - t1)
    return write, load, len(blob)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,1024,16384", help="run sizes, comma-separated")
    ap.add_argument("--steps", type=int, default=300, help="steps fed before the snapshot")
    ap.add_argument("--repeats", type=int, default=5, help="snapshots timed per size; the best is reported")
    ap.add_argument("--smoke", action="store_true", help="8 and 64 ranks, a few steps (the tests)")
    args = ap.parse_args()
    sizes = [8, 64] if args.smoke else [int(x) for x in args.ranks.split(",")]
    steps, repeats = (40, 1) if args.smoke else (args.steps, args.repeats)
    print("| ranks | steps | ms CPU to write | ms CPU to load | MB |")
    print("|---:|---:|---:|---:|---:|")
    for n_ranks in sizes:
        t0 = time.perf_counter()
        mon = fed_monitor(n_ranks, steps)
        print(f"  {n_ranks:,} ranks: fed {steps} steps in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        write, load, size = snapshot_costs(mon, n_ranks, repeats)
        print(f"| {n_ranks:,} | {steps:,} | {write * 1e3:.2f} | {load * 1e3:.2f} | {size / 1e6:.3f} |", flush=True)


if __name__ == "__main__":
    main()
