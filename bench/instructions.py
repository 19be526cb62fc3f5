"""Instructions a push costs the store's writer thread, counted by valgrind: the same on every run.

The timed benches (``bench/ingest.py``, ``bench/ingest_inproc.py``) read CPU time, which moves by
10-20 % from run to run on a shared machine: a change worth 5 % cannot be told from the noise.
This one counts instructions instead (valgrind's callgrind), which do not depend on what else the
machine does. It builds the served app (``create_app``: every feature installed, detectors off),
then, in one job on the store's writer thread, stores ``--pushes`` pre-parsed pushes of
``bench/ingest.py``'s workload through the ingest job the service runs, hands each group of four
results to the after-commit stages as a group commit would (the dashboard's and the per-run
series' hand-offs), and rolls the whole job back at the end. Only that loop is counted (a small
helper compiled here turns callgrind's counting on and off around it; the rest of the process
runs uninstrumented). Not counted: the commit itself (fsync, the kernel), the event loop's side
(HTTP, parse), and the stages' own threads (``bench/ingest_inproc.py`` names those).

    .venv/bin/python bench/instructions.py [--records 1,64,1024] [--pushes 600]
    .venv/bin/python bench/ab.py 91dd201 bench/instructions.py --pairs 1 --same bench/ingest.py

One pair is enough: the counts repeat to within a fraction of a per cent. ``--same
bench/ingest.py`` gives both trees the same workload (the payloads are made by that file).
Needs valgrind and gcc (``apt-get install valgrind gcc``). ``--smoke`` (the tests): a few pushes of
one size, still under valgrind.
"""
from __future__ import annotations

import argparse
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GROUP = 4   # results handed to the after-commit stages at a time (bench/ingest_inproc.py's clients)

TOGGLE_C = """
#include <valgrind/callgrind.h>
void count_on(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; CALLGRIND_TOGGLE_COLLECT; }
void count_off(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS_AT("loop"); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def build_toggle(tmp: str) -> str:
    """The helper that starts and stops callgrind's counting from Python (a client request is a
    magic instruction sequence only C can emit)."""
    src, lib = os.path.join(tmp, "toggle.c"), os.path.join(tmp, "toggle.so")
    with open(src, "w") as f:
        f.write(TOGGLE_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", lib, src], check=True)
    return lib


def child(records: int, pushes: int, toggle: str) -> None:
    """Runs under callgrind: the counted loop (see the module docstring)."""
    import ctypes

    from bench.ingest import make_payload, shape
    counter = ctypes.CDLL(toggle)
    os.environ["HEALTHSVC_DETECT"] = "0"
    tmp = tempfile.mkdtemp(prefix="instructions-")
    os.environ["HEALTHSVC_DB"] = os.path.join(tmp, "bench.db")
    import numpy as np
    from fastapi.testclient import TestClient

    import healthsvc.app as app_module
    from healthsvc.ingest.parse import parse_metrics
    from healthsvc.settings import Settings
    app = app_module.create_app(Settings())
    takes_limits = len(inspect.signature(parse_metrics).parameters) > 1   # 91dd201's takes the body alone
    rng = np.random.default_rng(records)
    n_steps, _ = shape(records)
    bodies = [make_payload("columns", records, i * n_steps, rng) for i in range(pushes + 1)]
    parsed = [parse_metrics(b, 1 << 20, 1 << 10) if takes_limits else parse_metrics(b) for b in bodies]
    try:
        with TestClient(app):
            store = app.state.ctx.store
            ingest = store.ingest._ingest if hasattr(store, "ingest") else store._ingest   # 91dd201: on the store
            run_id = f"instructions-{records}"
            first, first_digest = parsed[0]
            store._writer.submit(lambda conn: ingest(conn, run_id, first, first_digest)).result()   # the run exists

            def loop(conn) -> None:
                conn.execute("SAVEPOINT bench")
                counter.count_on()
                results = []
                for batch, digest in parsed[1:]:
                    results.append(ingest(conn, run_id, batch, digest))
                    if len(results) == GROUP:
                        store._notify(results)
                        results = []
                counter.count_off()
                conn.execute("ROLLBACK TO bench")
                conn.execute("RELEASE bench")

            store._writer.submit(loop).result()
            time.sleep(0.2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def count(records: int, pushes: int, toggle: str, tmp: str) -> int:
    """Instructions of the counted loop, from callgrind's dump of it."""
    out = os.path.join(tmp, f"callgrind-{records}.out")
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                           f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__), "--child",
                           "--records", str(records), "--pushes", str(pushes), "--toggle", toggle],
                          capture_output=True, text=True)
    dump = out + ".1"   # the dump the helper asked for (the final one, after it, counts nothing)
    if proc.returncode != 0 or not os.path.exists(dump):
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"instructions: the run of {records} records under valgrind failed (exit {proc.returncode})")
    with open(dump) as f:
        totals = [line for line in f if line.startswith("totals:")]
    return int(totals[0].split()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", default="1,64,1024", help="records per push, comma-separated")
    ap.add_argument("--pushes", type=int, default=0, help="counted pushes per size (default: 1,500 / 600 / 120)")
    ap.add_argument("--smoke", action="store_true", help="a few pushes of 64 records (the tests)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--toggle", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(int(args.records), args.pushes, args.toggle)
        return
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"instructions: needs {tool} (apt-get install valgrind gcc)")
    sizes = [64] if args.smoke else [int(x) for x in args.records.split(",")]
    tmp = tempfile.mkdtemp(prefix="instructions-")
    try:
        toggle = build_toggle(tmp)
        rows = []
        for records in sizes:
            pushes = 8 if args.smoke else (args.pushes or max(120, min(1500, 600 * 64 // max(records, 64))))
            t0 = time.perf_counter()
            total = count(records, pushes, toggle, tmp)
            rows.append((records, pushes, total))
            print(f"  {records:5d} records/push: {total / pushes:,.0f} instructions a push "
                  f"({time.perf_counter() - t0:.0f} s under valgrind)", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n| form | records/push | pushes | instructions / push | instructions / record |")
    print("|---|---:|---:|---:|---:|")
    for records, pushes, total in rows:
        print(f"| columns | {records:,} | {pushes:,} | {total / pushes:,.0f} | {total / pushes / records:,.0f} |")
    print("\n(the store's writer thread: the ingest job and the after-commit hand-offs, one job rolled back;"
          " valgrind's callgrind)")


if __name__ == "__main__":
    main()
