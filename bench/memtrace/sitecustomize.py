"""Bench only (``bench/soak.py --memtrace DIR``): a memory timeline of a server process, written
from inside it, so what grows can be named instead of guessed.

Python imports ``sitecustomize`` at start-up from the first directory on ``sys.path`` that has
one; the soak puts this directory first on replica 0's ``PYTHONPATH`` and sets
``HEALTHSVC_BENCH_MEMTRACE`` to an output directory. Nothing here is imported by the service or
its tests otherwise. Every ``HEALTHSVC_BENCH_MEMTRACE_EVERY`` seconds (default 30) it appends one
line to ``<dir>/<pid>.jsonl``: RSS and the anonymous memory (smaps_rollup), glibc malloc's
figures (mallinfo2), what tracemalloc traces (or, with ``HEALTHSVC_BENCH_MEMTRACE_FRAMES=0``,
pymalloc's arenas and the bytes in their blocks, from ``sys._debugmallocstats``, which prints
nothing while tracemalloc runs), and the live objects by type (gc); and once a baseline is taken (after
``HEALTHSVC_BENCH_MEMTRACE_BASE_S``, default 150 s) the lines of code whose live allocations grew
most since it (``tracemalloc`` snapshot diff), to ``<dir>/<pid>-diff-<n>.txt``.
"""
from __future__ import annotations

import os

_DIR = os.environ.get("HEALTHSVC_BENCH_MEMTRACE")


def _start(out: str) -> None:
    import ctypes
    import gc
    import json
    import re
    import sys
    import tempfile
    import threading
    import time
    import tracemalloc
    from collections import Counter

    frames = int(os.environ.get("HEALTHSVC_BENCH_MEMTRACE_FRAMES", "6"))
    every = float(os.environ.get("HEALTHSVC_BENCH_MEMTRACE_EVERY", "30"))
    base_after = float(os.environ.get("HEALTHSVC_BENCH_MEMTRACE_BASE_S", "150"))
    # pymalloc's own statistics are not printed while tracemalloc hooks the allocator:
    # HEALTHSVC_BENCH_MEMTRACE_FRAMES=0 gives them (and no tracemalloc diffs).
    if frames > 0:
        tracemalloc.start(frames)
    os.makedirs(out, exist_ok=True)
    pid = os.getpid()
    t0 = time.monotonic()

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Mallinfo2
    except (OSError, AttributeError):
        libc = None

    def pymalloc() -> dict:
        # _debugmallocstats writes to the C stderr: point fd 2 at a file for the call.
        with tempfile.TemporaryFile() as f:
            sys.stderr.flush()
            saved = os.dup(2)
            try:
                os.dup2(f.fileno(), 2)
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            f.seek(0)
            text = f.read().decode("ascii", "replace")
        got = {}
        for key, pat in (("arenas", r"# arenas allocated current\s*=\s*([\d,]+)"),
                         ("arenas_highwater", r"# arenas highwater mark\s*=\s*([\d,]+)"),
                         ("block_bytes", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
                         ("free_block_bytes", r"# bytes in available blocks\s*=\s*([\d,]+)"),
                         ("unused_pool_bytes", r"unused pools \* 16384 bytes\s*=\s*([\d,]+)"),
                         ("arena_bytes", r"Total\s*=\s*([\d,]+)")):
            m = re.search(pat, text)
            if m:
                got[key] = int(m.group(1).replace(",", ""))
        return got

    def smaps() -> dict:
        got = {}
        try:
            with open("/proc/self/smaps_rollup") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k in ("Rss", "Anonymous", "Private_Dirty"):
                        got[k.lower()] = int(v.split()[0]) * 1024
        except OSError:
            pass
        return got

    def loop() -> None:
        base = None
        base_types: Counter | None = None
        n = 0
        while True:
            time.sleep(every)
            n += 1
            now = time.monotonic() - t0
            line = {"t": round(now, 1), **smaps()}
            if not tracemalloc.is_tracing():
                line.update({f"pymalloc_{k}": v for k, v in pymalloc().items()})
            if libc is not None:
                m = libc.mallinfo2()
                line.update(malloc_arena=m.arena, malloc_mmap=m.hblkhd, malloc_in_use=m.uordblks,
                            malloc_free=m.fordblks)
            objs = gc.get_objects()
            types = Counter(type(o).__qualname__ for o in objs)
            # The stages' queue depths: a stage behind its input holds what waits in memory.
            for o in objs:
                name = type(o).__name__
                if name in ("MonitorHub", "GroupCommitWriter", "AlertingService", "RollupHub"):
                    q = getattr(o, "_queue", None)
                    if q is not None and hasattr(q, "qsize"):
                        line[f"queue_{name}"] = line.get(f"queue_{name}", 0) + q.qsize()
            del objs
            line["objects"] = sum(types.values())
            line["types"] = dict(types.most_common(40))
            if not tracemalloc.is_tracing():
                if base_types is None and now >= base_after:
                    base_types = types
                elif base_types is not None:
                    grown = sorted(((n - base_types.get(k, 0), k) for k, n in types.items()), reverse=True)[:30]
                    line["types_grown"] = {k: d for d, k in grown if d > 0}
                with open(os.path.join(out, f"{pid}.jsonl"), "a") as f:
                    f.write(json.dumps(line) + "\n")
                continue
            cur, peak = tracemalloc.get_traced_memory()
            line.update(traced=cur, traced_peak=peak)
            tracemalloc.reset_peak()
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)])
            if base is None and now >= base_after:
                base = snap
            elif base is not None:
                with open(os.path.join(out, f"{pid}-diff-{n:03d}.txt"), "w") as f:
                    f.write(f"t={now:.0f}s, against the baseline\n\nby line:\n")
                    for st in snap.compare_to(base, "lineno")[:40]:
                        f.write(f"{st}\n")
                    f.write("\nby traceback:\n")
                    for st in snap.compare_to(base, "traceback")[:12]:
                        f.write(f"{st.size_diff / 2**20:+.2f} MiB {st.count_diff:+d} blocks\n")
                        f.writelines(f"    {fr}\n" for fr in st.traceback.format())
            del snap
            with open(os.path.join(out, f"{pid}.jsonl"), "a") as f:
                f.write(json.dumps(line) + "\n")

    threading.Thread(target=loop, name="bench-memtrace", daemon=True).start()


if _DIR:
    _start(_DIR)
