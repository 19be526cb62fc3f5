"""What the per-host relay costs the training thread, and what it saves the service.

1. ``log()`` per call on the training thread, direct and through a relay, measured in the same
   run (interleaved rounds, median) against a baseline (appending the same dict to a list): with
   the relay alive, and after it was killed (the rank falls back to posting directly).
2. Metrics requests the service receives for ``--ranks`` ranks of one host logging ``--steps``
   steps at ``--step-ms`` per step, direct and through the relay (a counting sink in another
   process answers 202; the relay is ``python -m healthsvc_client.relay`` in its own process).

    .venv/bin/python bench/relay.py            # about two minutes
    .venv/bin/python bench/relay.py --quick    # a few seconds
    .venv/bin/python bench/relay.py --smoke    # tiny samples: proves it runs (tests)

Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from healthsvc_client.client import Run  # noqa: E402

COUNTING_SINK = """
import http.server, json, sys, threading
count = {"requests": 0}
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, body):
        self.send_response(202 if self.command == "POST" else 200)
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.endswith("/metrics"):
            with lock:
                count["requests"] += 1
        self.answer(b"{}")
    def do_GET(self):
        with lock:
            self.answer(json.dumps(count).encode())
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def start_relay(url: str, interval_s: float) -> tuple[subprocess.Popen, str]:
    sock = os.path.join(tempfile.mkdtemp(prefix="hsb", dir="/tmp"), "relay.sock")
    proc = subprocess.Popen([sys.executable, "-m", "healthsvc_client.relay", "--url", url, "--socket", sock,
                             "--interval-s", str(interval_s)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()  # "listening <sock>": ready
    return proc, sock


def sink_requests(url: str) -> int:
    with urllib.request.urlopen(url + "/count", timeout=10) as resp:
        return json.loads(resp.read())["requests"]


def per_call_us(run: Run | None, n: int) -> float:
    if run is None:  # the baseline
        start = time.perf_counter()
        records = []
        for step in range(n):
            records.append({"loss": 2.5, "grad_norm": 0.5, "step": step})
        return (time.perf_counter() - start) / n * 1e6
    log = run.log
    start = time.perf_counter()
    for step in range(n):
        log(loss=2.5, grad_norm=0.5, step=step)
    us = (time.perf_counter() - start) / n * 1e6
    run.flush(120.0)  # settle: the next measurement does not share the GIL with this one's sender
    return us


def bench_log(url: str, n: int, rounds: int) -> None:
    relay, sock = start_relay(url, 0.5)
    kwargs = dict(heartbeat_interval_s=0, max_queue=10 * n)
    direct = Run(url, "bench-direct", 0, **kwargs)
    relayed = Run(url, "bench-relay", 0, relay=sock, **kwargs)
    rows = []
    for _ in range(rounds):
        rows.append((per_call_us(None, n), per_call_us(direct, n), per_call_us(relayed, n)))
    relayed_stats = relayed.stats()
    relay.send_signal(signal.SIGKILL)
    relay.wait(10)
    dead = [per_call_us(relayed, n) for _ in range(rounds)]
    base, direct_us, relay_us = (statistics.median(col) for col in zip(*rows))
    dead_us = statistics.median(dead)
    print(f"log() on the training thread ({n} calls x {rounds} rounds, median; target <= 10 us):\n")
    print("| call | us / call | x baseline | note |\n|---|---:|---:|---|")
    for label, us, note in (
            ("baseline: append a dict to a list", base, ""), ("run.log(), direct", direct_us, ""),
            ("run.log(), through the relay", relay_us,
             f"{relayed_stats.relayed_requests} bodies relayed, {relayed_stats.relay_fallbacks} fallbacks"),
            ("run.log(), relay killed (fallback)", dead_us, f"{relayed.stats().relay_fallbacks} fallbacks")):
        print(f"| {label} | {us:.2f} | {us / base:.1f} | {note} |")
    for run in (direct, relayed):
        run.finish(10.0)


def bench_requests(url: str, ranks: int, steps: int, step_s: float, interval_s: float) -> None:
    def job(relay_sock: str | None) -> int:
        before = sink_requests(url)
        runs = [Run(url, "bench-req", r, world_size=ranks, heartbeat_interval_s=0, relay=relay_sock,
                    flush_interval_s=interval_s) for r in range(ranks)]

        def rank_loop(run: Run) -> None:
            for step in range(steps):
                run.log(loss=2.5, grad_norm=0.5, step=step)
                time.sleep(step_s)   # the step's compute
            run.finish(30.0)         # on the rank's own thread: ranks finish together

        threads = [threading.Thread(target=rank_loop, args=(run,)) for run in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sink_requests(url) - before

    direct = job(None)
    relay, sock = start_relay(url, interval_s)
    relayed = job(sock)
    relay.terminate()
    relay.wait(10)
    print(f"\nmetrics requests for {ranks} ranks x {steps} steps of {step_s * 1e3:g} ms, one host "
          f"(rank flush interval and relay interval {interval_s:g} s):\n")
    print("| path | requests | x fewer |\n|---|---:|---:|")
    print(f"| direct | {direct} | 1.0 |")
    print(f"| through relay | {relayed} | {direct / max(relayed, 1):.1f} |")


def main() -> None:
    logging.getLogger("healthsvc.client").setLevel(logging.ERROR)  # the killed relay is on purpose
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small samples (seconds)")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--smoke", action="store_true", help="tiny samples: proves it runs (tests)")
    args = parser.parse_args()
    if args.smoke:
        args.quick, args.ranks, args.steps, args.step_ms = True, 2, 3, 10.0
    sink = subprocess.Popen([sys.executable, "-c", COUNTING_SINK], stdout=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{sink.stdout.readline().strip()}"
    try:
        bench_log(url, 2_000 if args.smoke else 20_000 if args.quick else 200_000, 3)
        steps = args.steps or (20 if args.quick else 100)
        bench_requests(url, args.ranks, steps, args.step_ms / 1e3, 0.5)
    finally:
        sink.kill()


if __name__ == "__main__":
    main()
