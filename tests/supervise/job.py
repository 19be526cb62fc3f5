"""A small training job for the supervisor's tests: two ranks (hosts node-a, node-b) in one
process push per-step records with the real client, write a checkpoint every ``--ckpt-every``
steps (a JSON file holding the step) and register it.

Faults, in the first attempt only (a resumed job is healthy unless it restores badly):
``--nan-at K`` rank 1 reports a NaN loss and local gradient norm at step K; ``--crash-at K`` the
process exits 1 at step K; ``--hang-at K`` rank 1 stops reporting at step K (rank 0 goes on).
``--exclude`` (comma-separated hosts): the ranks of those hosts are not run.
``--reset-data-on-resume``: a resumed job starts its data position from zero (what a
``resume_mismatch`` catches). ``--ignore-sigterm``: only SIGKILL stops it. Each start appends its arguments to ``--log`` as
one JSON line, so a test sees what the supervisor substituted."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from healthsvc_client.client import Run

HOSTS = ("node-a", "node-b")
BATCH = 8


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-s", type=float, default=0.02)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--resume", default="")
    p.add_argument("--exclude", default="")
    p.add_argument("--world-size", default="")
    p.add_argument("--nan-at", type=int)
    p.add_argument("--crash-at", type=int)
    p.add_argument("--hang-at", type=int)
    p.add_argument("--reset-data-on-resume", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--log", required=True)
    a = p.parse_args()
    with open(a.log, "a") as f:
        f.write(json.dumps({"resume": a.resume, "exclude": a.exclude, "world_size": a.world_size,
                            "pid": os.getpid(), "at": time.time()}) + "\n")
    if a.ignore_sigterm:        # a job stuck in a collective does not stop on SIGTERM either
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    start = 0
    if a.resume:
        start = json.loads(Path(a.resume.removeprefix("file://")).read_text())["step"] + 1
    ranks = [r for r in range(len(HOSTS)) if HOSTS[r] not in a.exclude.split(",")]
    runs = {r: Run(a.url, a.run_id, rank=r, host=HOSTS[r], world_size=len(ranks), flush_interval_s=0.05,
                   heartbeat_interval_s=0, timeout_s=2.0, max_attempts=1) for r in ranks}
    ckpt_dir = Path(a.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    for step in range(start, a.steps):
        first = not a.resume
        if first and step == a.crash_at:
            return 1
        cursor = (step - start + 1 if a.resume and a.reset_data_on_resume else step + 1) * BATCH
        for r, run in runs.items():
            if first and a.hang_at is not None and step >= a.hang_at and r == 1:
                continue
            bad = first and step == a.nan_at and r == 1
            loss = float("nan") if bad else 2.0 - 1e-3 * step
            run.log(step=step, loss=loss, grad_norm=1.0, local_grad_norm=loss if bad else 1.0,
                    data_cursor=cursor)
        if (step + 1) % a.ckpt_every == 0:
            path = ckpt_dir / f"step{step}.json"
            path.write_text(json.dumps({"step": step}))
            runs[ranks[0]].checkpoint(step, f"file://{path}")
        time.sleep(a.step_s)
    for run in runs.values():
        run.finish(timeout_s=2.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
