"""Microseconds per step for each streaming detector and for the whole set.

Feeds a synthetic synchronous run (loss, global and local grad norms, step/compute/comm time)
at 8, 1,024, 16,384 and 131,072 ranks, in blocks of 1 step (the streaming case: one aligned frame
at a time) and of 16 steps (a burst after a slow push), and prints a markdown table of
CPU microseconds per step (``time.process_time``: this process's CPU time, so other work on a
shared machine does not count; best of ``--repeats`` timed passes after a warm-up pass).
The hang detector is driven as the service drives it: one ``observe(ranks, steps, now)`` of the
whole frame plus one ``tick(now)`` per step.

A baseline measured in the same run, ``np.median`` of one step x ranks row, is printed too so the
figures can be compared across machines (the ``x median`` column).

Targets (issue 3): <= 20 us per detector per step at 1,024 ranks, <= 100 us at 16,384.

The "in the service's suite" rows run the detectors as the service does: one suite per run, whose
spike detectors and ``rank_outlier`` share one per-rank tracker per metric (the first to read a
block pays for it).

    .venv/bin/python bench/detectors.py            # full table (under a minute)
    .venv/bin/python bench/detectors.py --quick    # 8 and 1,024 ranks only
    .venv/bin/python bench/detectors.py --smoke    # 8 and 64 ranks, one pass: proves it runs (tests)
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from healthsvc_detectors.base import Detector  # noqa: E402
from healthsvc_detectors.frame import StepBlock  # noqa: E402
from healthsvc_detectors.hang import HangDetector  # noqa: E402
from healthsvc_detectors.slowdown import SlowdownDetector  # noqa: E402
from healthsvc_detectors.straggler import StragglerDetector  # noqa: E402

VALUE_MODULES = ("healthsvc_detectors.non_finite", "healthsvc_detectors.spike", "healthsvc_detectors.divergence",
                 "healthsvc_detectors.rank_outlier")


def value_detectors() -> list[type[Detector]]:
    """Concrete Detector subclasses defined in the value-detector modules (or their packages'
    modules) that exist."""
    found: list[type[Detector]] = []
    for name in VALUE_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        for obj in vars(mod).values():
            if (inspect.isclass(obj) and issubclass(obj, Detector)
                    and (obj.__module__ == name or obj.__module__.startswith(name + "."))
                    and not inspect.isabstract(obj) and obj not in found):
                try:
                    obj()
                except TypeError:
                    continue   # needs arguments: not a ready-to-use detector
                found.append(obj)
    # A base class whose subclasses are also listed is benchmarked through them.
    return [c for c in found if not any(o is not c and issubclass(o, c) for o in found)]


def make_block(n_steps: int, n_ranks: int, seed: int = 0) -> StepBlock:
    """A clean synchronous run: every rank reports every metric at every step."""
    rng = np.random.default_rng(seed)
    shape = (n_steps, n_ranks)
    steps = np.arange(n_steps)
    compute = 0.4 * np.exp(rng.normal(0.0, 0.02, shape))
    slowest = compute.max(axis=1, keepdims=True)
    comm = 0.08 + (slowest - compute)
    step_time = np.broadcast_to(slowest + 0.08, shape) + rng.normal(0.0, 1e-4, shape) ** 2
    loss = (2.0 + 8.0 / np.sqrt(1.0 + steps / 50.0))[:, None] * np.exp(rng.normal(0.0, 0.04, shape))
    grad = np.broadcast_to((1.0 + np.exp(-steps / 100.0))[:, None]
                           * np.exp(rng.normal(0.0, 0.1, (n_steps, 1))), shape)
    local = grad * 1.6 * np.exp(rng.normal(0.0, 0.08, shape))
    return StepBlock.from_dense(
        steps, np.arange(n_ranks), loss=loss, grad_norm=np.ascontiguousarray(grad),
        local_grad_norm=local, step_time=step_time, compute_time=compute, comm_time=comm)


def blocks_of(block: StepBlock, size: int) -> list[StepBlock]:
    return [block.slice_steps(i, i + size) for i in range(0, block.n_steps, size)]


def time_block_detector(cls: type[Detector], warm: list[StepBlock], timed: list[StepBlock],
                        repeats: int) -> float:
    """Best CPU seconds for one pass over ``timed`` after feeding ``warm`` (state warmed up)."""
    runs = []
    for _ in range(repeats):
        det = cls()
        for b in warm:
            det.update(b)
        t0 = time.process_time()
        for b in timed:
            det.update(b)
        runs.append(time.process_time() - t0)
    return float(np.min(runs))


def time_hang(block: StepBlock, timed_steps: int, repeats: int) -> float:
    """Best CPU seconds for ``timed_steps`` rounds of observe(frame) + tick()."""
    ranks = block.ranks
    runs = []
    for _ in range(repeats):
        det = HangDetector()
        det.set_world(ranks, 0.0)
        for i in range(10):   # learn push intervals
            det.observe(ranks, np.full(len(ranks), i), float(i))
        t0 = time.process_time()
        for i in range(10, 10 + timed_steps):
            det.observe(ranks, np.full(len(ranks), i), float(i))
            det.tick(float(i) + 0.5)
        runs.append(time.process_time() - t0)
    return float(np.min(runs))


def time_suite(warm: list[StepBlock], timed: list[StepBlock], repeats: int) -> dict[str, float]:
    """Best CPU seconds per aligned detector as the service runs them: one suite (its per-rank
    trackers shared between the spike detectors and rank_outlier: the first reader of a block
    pays for it, the others read the same view)."""
    from healthsvc.monitor.suite import build_suite
    best: dict[str, float] = {}
    for _ in range(repeats):
        dets = build_suite({}).aligned
        for b in warm:
            for d in dets.values():
                d.update(b)
        spent = dict.fromkeys(dets, 0.0)
        for b in timed:
            for name, d in dets.items():
                t0 = time.process_time()
                d.update(b)
                spent[name] += time.process_time() - t0
        for name, sec in spent.items():
            best[name] = min(best.get(name, float("inf")), sec)
    return best


def baseline_median_us(n_ranks: int) -> float:
    row = np.random.default_rng(1).random(n_ranks)
    k = max(50, 20_000 // max(1, n_ranks // 64))
    t0 = time.process_time()
    for _ in range(k):
        np.median(row)
    return (time.process_time() - t0) / k * 1e6


def exact_block(n_steps: int, n_ranks: int, digest_every: int) -> StepBlock:
    """What the exact checks read: a digest code per rank every ``digest_every`` steps (equal on
    every rank but one, which diverges halfway), ``data_cursor`` and ``lr`` every step."""
    steps = np.arange(n_steps)
    codes = np.tile((steps * 7.0)[:, None], (1, n_ranks))
    codes[n_steps // 2:, n_ranks // 3] += 1.0
    has = np.zeros(codes.shape, bool)
    has[steps % digest_every == digest_every - 1] = True
    cursor = np.tile(((steps + 1) * 8.0)[:, None], (1, n_ranks))
    lr = np.tile((1e-3 * (1 - steps / 1e5))[:, None], (1, n_ranks))
    return StepBlock(steps=steps, ranks=np.arange(n_ranks),
                     values={"param_digest": codes, "data_cursor": cursor, "lr": lr},
                     present={"param_digest": has, "data_cursor": np.ones(codes.shape, bool),
                              "lr": np.ones(codes.shape, bool)})


def time_exact_checks(sizes: tuple[int, ...], repeats: int) -> None:
    """replica_mismatch (digests every step: the worst case; every 20 steps: the default) and
    resume_mismatch, in 16-step blocks, CPU microseconds per step."""
    from healthsvc_detectors.replica import ReplicaMismatchDetector
    from healthsvc_detectors.resume import ResumeMismatchDetector
    print("\n| exact check, 16/block | " + " | ".join(f"{r:,} ranks" for r in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    rows = {"replica_mismatch, digests every step": (ReplicaMismatchDetector, 1),
            "replica_mismatch, digests every 20 steps": (ReplicaMismatchDetector, 20),
            "resume_mismatch": (ResumeMismatchDetector, 20)}
    for name, (cls, every) in rows.items():
        cells = []
        for n_ranks in sizes:
            timed = blocks_of(exact_block(64, n_ranks, every), 16)
            cells.append(time_block_detector(cls, [], timed, repeats) / 64 * 1e6)
        print(f"| {name} | " + " | ".join(f"{us:,.1f}" for us in cells) + " |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only 8 and 1,024 ranks")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--timing-only", action="store_true", help="skip the value detectors")
    ap.add_argument("--exact-only", action="store_true", help="only the exact checks (replica, resume)")
    ap.add_argument("--smoke", action="store_true", help="8 and 64 ranks, one pass: proves it runs (tests)")
    args = ap.parse_args(argv)
    sizes = (8, 64) if args.smoke else (8, 1024) if args.quick else (8, 1024, 16_384, 131_072)
    if args.smoke:
        args.repeats = 1
    if args.exact_only:
        return time_exact_checks((1024, 16_384), args.repeats)
    block_sizes = (1, 16)
    value = [] if args.timing_only else value_detectors()
    timing: list[type[Detector]] = [StragglerDetector, SlowdownDetector]
    names = [c.__name__ for c in timing] + ["HangDetector"] + [c.__name__ for c in value]
    print(f"value detectors found: {', '.join(c.__name__ for c in value) or 'none'}\n")
    header = "| detector | " + " | ".join(f"{r:,} ranks, {b}/block" for r in sizes for b in block_sizes)
    print(header + " |")
    print("|---|" + "---:|" * (len(sizes) * len(block_sizes)))
    table: dict[str, list[float]] = {n: [] for n in names + ["whole set"]}
    suite_rows: dict[str, list[float]] = {}
    base: list[float] = []
    for n_ranks in sizes:
        # Fewer timed steps where each costs more, so the whole bench stays near a minute.
        timed_steps = 128 if n_ranks <= 1024 else (48 if n_ranks <= 16_384 else 16)
        repeats = args.repeats if n_ranks <= 16_384 else 3
        # Past every warm-up (straggler: 10 steps; slowdown: 150) where memory allows.
        warm_steps = int(np.clip(2_000_000 // n_ranks, 40, 320))
        full = make_block(warm_steps + timed_steps, n_ranks)
        base_us = baseline_median_us(n_ranks)
        for bs in block_sizes:
            base.append(base_us)
            warm = blocks_of(full.slice_steps(0, warm_steps), 64)
            timed = blocks_of(full.slice_steps(warm_steps, warm_steps + timed_steps), bs)
            total = 0.0
            for cls in timing + value:
                us = time_block_detector(cls, warm, timed, repeats) / timed_steps * 1e6
                table[cls.__name__].append(us)
                total += us
            hang_us = time_hang(full, timed_steps, repeats) / timed_steps * 1e6
            table["HangDetector"].append(hang_us)
            table["whole set"].append(total + hang_us)
            if not args.timing_only:
                in_suite = time_suite(warm, timed, repeats)
                for name, sec in in_suite.items():
                    suite_rows.setdefault(f"in the service's suite: {name}", []).append(sec / timed_steps * 1e6)
                suite_rows.setdefault("in the service's suite: every block detector + hang", []).append(
                    sum(in_suite.values()) / timed_steps * 1e6 + hang_us)
    for name, row in {**table, **suite_rows}.items():
        print(f"| {name} | " + " | ".join(f"{us:,.1f}" for us in row) + " |")
    print("| baseline: np.median of one row | " + " | ".join(f"{us:,.1f}" for us in base) + " |")
    print("\nCPU microseconds per step (best of repeats); targets: <= 20 us per detector "
          "at 1,024 ranks, <= 100 us at 16,384")
    time_exact_checks(sizes[1:3] if len(sizes) > 2 else sizes[1:], args.repeats)


if __name__ == "__main__":
    main()
