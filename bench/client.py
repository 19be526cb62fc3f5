"""What the client costs the training thread.

1. ``log()`` per call, against a baseline measured in the same run (appending the same dict to a
   list), with the service healthy (mock transport), hung (the sender thread is stuck in a request)
   and through the module-level ``healthsvc_client.log``.
2. Step time of a real tiny training (the example's char-level GPT, one process, CPU) with the
   client off, on (a sink HTTP server in another process answering 202), and with the service down
   (an unreachable port). Rounds alternate the three so drift on a shared machine hits all alike.

    .venv/bin/python bench/client.py            # about a minute
    .venv/bin/python bench/client.py --quick    # a few seconds, smaller samples
    .venv/bin/python bench/client.py --smoke    # tiny samples: proves it runs (tests)

Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import logging
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import healthsvc_client  # noqa: E402
from healthsvc_client.client import Run  # noqa: E402
from healthsvc_client.transport import MockTransport, Response  # noqa: E402

SINK = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(202); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    fn(n)
    return (time.perf_counter() - start) / n * 1e6


def bench_log(n: int) -> None:
    def baseline(n: int) -> None:
        records = []
        for step in range(n):
            records.append({"loss": 2.5, "grad_norm": 0.5, "step": step})

    healthy = Run("http://mock", "bench", 0, transport=MockTransport(lambda r: Response(202)),
                  heartbeat_interval_s=0, max_queue=10 * n)

    def run_log(n: int, run: Run = healthy) -> None:
        log = run.log
        for step in range(n):
            log(loss=2.5, grad_norm=0.5, step=step)

    release = threading.Event()
    # Default queue size: with the service hung the queue fills and the oldest records are dropped.
    hung = Run("http://mock", "bench", 0, transport=MockTransport(lambda r: release.wait(60) and Response(202)),
               heartbeat_interval_s=0)
    hung.log(loss=1.0, step=0)
    hung.flush(0.2)  # the sender is now stuck inside its first request

    healthsvc_client.init("http://mock", "bench", 0, transport=MockTransport(lambda r: Response(202)),
                 heartbeat_interval_s=0, max_queue=10 * n)

    def module_log(n: int) -> None:
        for step in range(n):
            healthsvc_client.log(loss=2.5, grad_norm=0.5, step=step)

    def settled(us: float) -> float:
        # Let the senders finish encoding what was just logged, so the next measurement does not
        # share the GIL with the previous one's background work.
        healthy.flush(120.0)
        healthsvc_client.flush(120.0)
        return us

    rows = []
    for _ in range(3):  # interleaved repeats; the median is printed
        rows.append((settled(per_call_us(baseline, n)), settled(per_call_us(run_log, n)),
                     settled(per_call_us(lambda k: run_log(k, hung), n)), settled(per_call_us(module_log, n))))
    base, healthy_us, hung_us, module_us = (statistics.median(col) for col in zip(*rows))
    print(f"log() on the training thread ({n} calls x 3 rounds, median; target <= 10 us):\n")
    print("| call | us / call | x baseline |\n|---|---:|---:|")
    for label, us in (("baseline: append a dict to a list", base), ("run.log(), service healthy", healthy_us),
                      ("run.log(), service hung", hung_us), ("healthsvc_client.log() (module facade)", module_us)):
        print(f"| {label} | {us:.2f} | {us / base:.1f} |")
    release.set()
    for run in (healthy, hung, healthsvc_client.current_run()):
        run.finish(5.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_training(steps: int, rounds: int) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from train import CharGPT, Config, encode_corpus, get_batch

    torch.set_num_threads(1)
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    sink_url = f"http://127.0.0.1:{sink.stdout.readline().strip()}"
    cfg = Config()
    data, vocab = encode_corpus()

    def train(mode: str) -> float:
        """Median step time (s) of ``steps`` steps with the client in ``mode``."""
        if mode == "off":
            run = Run(None, "bench", 0, mode="disabled")
        else:
            url = sink_url if mode == "on" else f"http://127.0.0.1:{free_port()}"
            run = Run(url, "bench", 0, heartbeat_interval_s=1.0)
        torch.manual_seed(0)
        model = CharGPT(cfg, vocab)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        timer = healthsvc_client.StepTimer(run=run)
        times = []
        for step in range(steps):
            t0 = time.perf_counter()
            timer.start_step(step)
            with timer.data():
                x, y = get_batch(data, cfg, step, 0)
            with timer.compute():
                loss = model(x, y)
                opt.zero_grad()
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            run.log(loss=loss.item(), grad_norm=grad_norm.item(), step=step, **timer.end_step())
            times.append(time.perf_counter() - t0)
        run.finish(1.0)
        return statistics.median(times)

    results: dict[str, list[float]] = {"off": [], "on": [], "down": []}
    train("off")  # warm-up: first-iteration allocations, lazy imports
    for i in range(rounds):
        order = list(results) if i % 2 == 0 else list(reversed(results))
        for mode in order:
            results[mode].append(train(mode))
    sink.kill()
    print(f"\nstep time of a tiny CPU training ({steps} steps x {rounds} rounds per mode; median step "
          f"time, and the median over rounds of the ratio to 'off' in the same round):\n")
    print("| client | ms / step | x off | rounds x off |\n|---|---:|---:|---|")
    for mode, label in (("off", "client off (disabled)"), ("on", "client on, service healthy"),
                        ("down", "client on, service down (refused)")):
        value = statistics.median(results[mode])
        ratios = sorted(m / o for m, o in zip(results[mode], results["off"]))
        print(f"| {label} | {value * 1e3:.2f} | {statistics.median(ratios):.3f} | {ratios[0]:.3f}-{ratios[-1]:.3f} |")


def main() -> None:
    logging.getLogger("healthsvc.client").setLevel(logging.ERROR)  # "service down" is on purpose
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small samples (seconds)")
    parser.add_argument("--smoke", action="store_true", help="tiny samples: proves it runs (tests)")
    args = parser.parse_args()
    if args.smoke:
        bench_log(2_000)
        bench_training(steps=5, rounds=1)
        return
    bench_log(20_000 if args.quick else 200_000)
    bench_training(steps=40 if args.quick else 100, rounds=2 if args.quick else 9)


if __name__ == "__main__":
    main()
