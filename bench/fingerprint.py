"""What a replica fingerprint (``healthsvc_client.digest.param_digest``) costs, against the training step.

Two models on the CPU, one thread (the example trainer's setting):

1. the example's char-level GPT (``examples/train.py``, about 30 k parameters), with AdamW;
2. a model of about 100 M parameters (a stack of 2048 x 2048 linear layers) with AdamW, a batch
   of 16 rows.

For each: the median of a training step (forward, backward, optimizer update), of a fingerprint
of the parameters, and of one with the optimizer state too, in alternating rounds so drift on a
shared machine hits all alike; then the share of the step time at a fingerprint every N steps.
The default ``FINGERPRINT_EVERY`` is chosen so that share stays at or below 1 %.

    .venv/bin/python bench/fingerprint.py            # about a minute
    .venv/bin/python bench/fingerprint.py --quick    # the example model only, a few seconds
    .venv/bin/python bench/fingerprint.py --smoke    # the example model, 5 rounds: proves it runs (tests)

Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from healthsvc_client.digest import FINGERPRINT_EVERY, param_digest  # noqa: E402
import train as example  # noqa: E402


def example_model():
    cfg = example.Config()
    data, vocab = example.encode_corpus()
    torch.manual_seed(cfg.seed)
    model = example.CharGPT(cfg, vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    step = [0]

    def train_step() -> None:
        x, y = example.get_batch(data, cfg, step[0], 0)
        step[0] += 1
        loss = model(x, y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
    return "example CharGPT", model, opt, train_step


def large_model(width: int = 2048, depth: int = 24):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, width)

    def train_step() -> None:
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
    return f"{depth} x Linear({width}, {width})", model, opt, train_step


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name, model, opt, train_step, rounds: int) -> dict:
    n_params = sum(p.numel() for p in model.parameters())
    for _ in range(2):  # warm-up: the optimizer state exists after the first step
        train_step()
    param_digest(model, optimizer=opt)
    step_s, fp_s, fp_opt_s = [], [], []
    for _ in range(rounds):
        step_s.append(timed(train_step))
        fp_s.append(timed(lambda: param_digest(model)))
        fp_opt_s.append(timed(lambda: param_digest(model, optimizer=opt)))
    step, fp, fp_opt = (statistics.median(v) for v in (step_s, fp_s, fp_opt_s))
    print(f"\n{name}: {n_params / 1e6:.2f} M parameters, median of {rounds} rounds "
          f"(fingerprint: {fp / n_params * 1e9:.2f} ns per parameter)\n")
    print(f"| {name}: work | ms | % of a step |\n|---|---:|---:|")
    for label, s in (("training step", step), ("fingerprint (parameters)", fp),
                     ("fingerprint (+ optimizer state)", fp_opt)):
        print(f"| {label} | {s * 1e3:.2f} | {100 * s / step:.2f} |")
    print(f"\n| {name}: fingerprint every | % of training time | + optimizer state, % |\n|---|---:|---:|")
    for every in (1, 5, FINGERPRINT_EVERY, 50):
        print(f"| {every} steps | {100 * fp / step / every:.3f} | {100 * fp_opt / step / every:.3f} |")
    return {"step_s": step, "fingerprint_s": fp, "fingerprint_opt_s": fp_opt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the example model only")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per model (default: 200 / 7)")
    parser.add_argument("--smoke", action="store_true", help="the example model, 5 rounds: proves it runs (tests)")
    args = parser.parse_args()
    if args.smoke:
        args.quick, args.rounds = True, 5
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; FINGERPRINT_EVERY = {FINGERPRINT_EVERY}")
    measure(*example_model(), rounds=args.rounds or 200)
    if not args.quick:
        measure(*large_model(), rounds=args.rounds or 7)


if __name__ == "__main__":
    main()
