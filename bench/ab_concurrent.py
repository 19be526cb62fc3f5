"""A/B of ingest at the same moment: two servers, one per tree, loaded side by side.

``bench/ab.py`` alternates whole runs of a bench on two trees, and on a shared machine the runs
of one tree meet other conditions than the next run of the other: an A/A (the same code on both
sides) reads 0.83-1.16 by row over four counterbalanced pairs (docs/performance.md), wider than
the differences the last-release bar asks about. Here the two trees' servers run at the same
time, each with its own store, each pushed by its own client threads with the same payloads
(``bench/ingest.py``'s workload), so whatever the machine does to one in a round it does to the
other. Each round reads each server's CPU from /proc and gives one ratio, B's requests per server
CPU-second over A's; the table shows the median ratio over the rounds and its spread.

A is a git ref checked out into a scratch worktree (``bench/ab.py``'s, removed afterwards), B the
working tree; each server's ``PYTHONPATH`` is its own tree (and links to its renamed packages), so
its code is what runs. The two compete for the same cores, so the absolute figures are about half
of one server's alone; the ratio is the measure. ``HEAD`` as the ref is the A/A: it shows what
this protocol's own noise is.

    .venv/bin/python bench/ab_concurrent.py 91dd201                      # every case, 8 rounds
    .venv/bin/python bench/ab_concurrent.py HEAD --rounds 6               # the A/A
    .venv/bin/python bench/ab_concurrent.py 91dd201 --cases columns:64,rows:64 --detect
    .venv/bin/python bench/ab_concurrent.py 91dd201 --env HEALTHSVC_INGEST_FAST_PATH=0   # the FastAPI route
    .venv/bin/python bench/ab_concurrent.py 91dd201 --per-thread --cases rows:64   # where B's CPU differs
    .venv/bin/python bench/ab_concurrent.py HEAD --smoke                  # tests: it runs

``--per-thread`` adds each server thread's CPU per acknowledged request over the rounds, A and B
measured under the same load (threads named by ``py-spy dump`` when py-spy is installed).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from ab import ScratchTree, describe, own_names  # noqa: E402  (bench/ab.py)
from ingest import by_thread_name, load, make_payload, shape, thread_cpu  # noqa: E402  (bench/ingest.py)
from tests.server_process import ServerProcess  # noqa: E402

CASES = "columns:1,columns:64,columns:1024,rows:1,rows:64,rows:1024"


def code_env(tree: Path, links: Path) -> dict[str, str]:
    """The environment that runs ``tree``'s code: its own path first (``bench/ab.py``'s
    run_bench), and no current directory on the path (``python -m`` would put this process's,
    the working tree, ahead of it: PYTHONSAFEPATH)."""
    return {"PYTHONPATH": os.pathsep.join([str(tree), str(own_names(tree, links))]), "PYTHONSAFEPATH": "1"}


def check_code(tree: Path, links: Path) -> None:
    """Fail unless a process started as the servers are imports ``healthsvc`` from ``tree``."""
    where = subprocess.run([sys.executable, "-c", "import healthsvc; print(healthsvc.__file__)"],
                           env={**os.environ, **code_env(tree, links)}, capture_output=True, text=True,
                           check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"a server for {tree} would import healthsvc from {where}")


def server_of(tree: Path, links: Path, db: str, detect: bool, settings: dict[str, str] | None = None) -> ServerProcess:
    """A server running ``tree``'s code, with ``settings`` (environment variables) on top."""
    return ServerProcess(db, env={**code_env(tree, links), "HEALTHSVC_DETECT": "1" if detect else "0", **(settings or {})})


class Pusher:
    """One server's clients for one case: each client thread is a run of its own that sends its
    pre-serialised steps in order (as ``bench/ingest.py``'s ``run_case``), through the rounds."""

    def __init__(self, server: ServerProcess, form: str, n_records: int, threads: int, payloads: int,
                 tag: str) -> None:
        self.server, self.n_records = server, n_records
        rng = np.random.default_rng(n_records)    # the same payloads for A and B
        n_steps, _ = shape(n_records)
        per_client = max(1, payloads // threads)
        self.bodies = [[make_payload(form, n_records, i * n_steps, rng) for i in range(per_client)]
                       for _ in range(threads)]
        self.next = [0] * threads
        self.threads = threads
        self.run_id = f"abc-{tag}-{form}-{n_records}"
        self.thread_cpu_s: dict[str, float] = {}   # thread id -> CPU-s over the rounds
        self.acknowledged = 0

    def request(self, client, k: int) -> bool | None:
        bodies = self.bodies[k]
        if self.next[k] >= len(bodies):
            return None   # out of payloads: this client is done
        body = bodies[self.next[k]]
        self.next[k] += 1
        r = client.post(f"/v1/runs/{self.run_id}-c{k}/metrics", content=body,
                        headers={"content-type": "application/json"})
        return r.status_code == 202

    def round(self, seconds: float, out: dict) -> None:
        before = thread_cpu(self.server.pid)
        ok, errors, wall, cpu = load(self.server, self.request, seconds, self.threads)
        for tid, s in thread_cpu(self.server.pid).items():
            self.thread_cpu_s[tid] = self.thread_cpu_s.get(tid, 0.0) + s - before.get(tid, 0.0)
        self.acknowledged += ok
        out.update(ok=ok, errors=errors, requests_per_cpu_s=ok / cpu)

    def ms_per_request_by_thread(self) -> dict[str, float]:
        """Each named thread's CPU-ms per acknowledged request over the rounds so far."""
        return by_thread_name(self.server.pid, self.thread_cpu_s, self.acknowledged)


def side_by_side(a: Pusher, b: Pusher, seconds: float) -> tuple[dict, dict]:
    """One round: both servers loaded at once for ``seconds``."""
    res_a: dict = {}
    res_b: dict = {}
    ta = threading.Thread(target=a.round, args=(seconds, res_a))
    tb = threading.Thread(target=b.round, args=(seconds, res_b))
    ta.start()
    tb.start()
    ta.join()
    tb.join()
    return res_a, res_b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ref", nargs="?", help="git ref of tree A (HEAD: the A/A; --smoke alone takes HEAD)")
    ap.add_argument("--cases", default=CASES, help=f"form:records, comma-separated (default {CASES})")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per case (each gives one ratio)")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per round")
    ap.add_argument("--threads", type=int, default=2, help="client threads per server")
    ap.add_argument("--detect", action="store_true", help="run the detectors on both sides")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting for both servers, e.g. HEALTHSVC_INGEST_FAST_PATH=0 (repeatable)")
    ap.add_argument("--per-thread", action="store_true",
                    help="also each server thread's CPU per request (py-spy names them): where B's differs")
    ap.add_argument("--smoke", action="store_true", help="one small case, two short rounds (the tests)")
    args = ap.parse_args()
    bad = [e for e in args.env if "=" not in e]
    if bad:
        ap.error(f"--env takes NAME=VALUE, got {bad[0]!r}")
    settings = dict(e.split("=", 1) for e in args.env)
    if args.smoke:
        args.cases, args.rounds, args.seconds = "columns:64", 2, 0.3
        args.ref = args.ref or "HEAD"
    if args.ref is None:
        ap.error("the ref of tree A is required (HEAD for the A/A)")
    cases = [(form, int(n)) for form, n in (c.split(":") for c in args.cases.split(","))]
    repo = HERE.parent
    head_a, head_b = describe(repo, args.ref)
    rows = []
    by_thread = []   # (form, n, thread, A ms / request, B ms / request)
    with ScratchTree(repo, args.ref) as tree_a, tempfile.TemporaryDirectory(prefix="ab-concurrent-") as tmp:
        links_a, links_b = Path(tmp, "links-a"), Path(tmp, "links-b")
        check_code(tree_a, links_a)
        check_code(repo, links_b)
        for form, n in cases:
            # Enough payloads for every round (each step is pushed once: no duplicates), at well
            # above the rate one server alone reaches on this machine at that size.
            rate = 3000 if n <= 64 else max(40, 400 * 1024 // n)
            payloads = args.threads * int((args.rounds + 1) * args.seconds * rate / args.threads)
            servers = [server_of(tree_a, links_a, os.path.join(tmp, f"a-{form}-{n}.db"), args.detect, settings),
                       server_of(repo, links_b, os.path.join(tmp, f"b-{form}-{n}.db"), args.detect, settings)]
            for s in servers:
                s.start(timeout_s=60)
            try:
                a = Pusher(servers[0], form, n, args.threads, payloads, "a")
                b = Pusher(servers[1], form, n, args.threads, payloads, "b")
                side_by_side(a, b, min(0.5, args.seconds))   # warm-up: runs created, caches warm
                ratios, per_a, per_b = [], [], []
                for i in range(args.rounds):
                    ra, rb = side_by_side(a, b, args.seconds)
                    if ra["errors"] or rb["errors"] or not ra["ok"] or not rb["ok"]:
                        raise SystemExit(f"{form} {n}: round {i + 1}: A {ra['ok']} pushes ({ra['errors']} failed), "
                                         f"B {rb['ok']} ({rb['errors']} failed): every round needs pushes on both")
                    per_a.append(ra["requests_per_cpu_s"])
                    per_b.append(rb["requests_per_cpu_s"])
                    ratios.append(per_b[-1] / per_a[-1])
                    print(f"  {form} {n}: round {i + 1}/{args.rounds}: A {per_a[-1]:,.0f}, B {per_b[-1]:,.0f} "
                          f"requests / CPU-s, B / A {ratios[-1]:.3f}", file=sys.stderr, flush=True)
                if args.per_thread:
                    ta, tb = a.ms_per_request_by_thread(), b.ms_per_request_by_thread()
                    for name in sorted(set(ta) | set(tb), key=lambda k: -max(ta.get(k, 0), tb.get(k, 0))):
                        if max(ta.get(name, 0.0), tb.get(name, 0.0)) >= 5e-4:   # a tick or two: idle
                            by_thread.append((form, n, name, ta.get(name, 0.0), tb.get(name, 0.0)))
            finally:
                for s in servers:
                    s.stop()
            rows.append((form, n, statistics.median(per_a), statistics.median(per_b),
                         statistics.median(ratios), min(ratios), max(ratios), len(ratios)))
    print(f"\n{head_a}\n{head_b}\n")
    print(f"(both servers loaded at once, {args.threads} client threads each, {args.seconds:g} s a round; "
          f"detectors {'on' if args.detect else 'off'}{''.join(', ' + e for e in args.env)}; "
          "requests per server CPU-second)\n")
    print("| form | records/request | A requests / CPU-s | B requests / CPU-s | B / A median | B / A min-max | rounds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for form, n, ma, mb, med, lo, hi, k in rows:
        print(f"| {form} | {n:,} | {ma:,.0f} | {mb:,.0f} | {med:.3f} | {lo:.3f}–{hi:.3f} | {k} |")
    if by_thread:
        print("\n| form | records/request | thread | A ms CPU / request | B ms CPU / request | B − A |")
        print("|---|---:|---|---:|---:|---:|")
        for form, n, name, ma, mb in by_thread:
            print(f"| {form} | {n:,} | {name} | {ma:.4f} | {mb:.4f} | {mb - ma:+.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
