"""A run with a straggler and a NaN, pushed over HTTP into a real server (columns, as a rank-0
aggregator or a replay sends them), with a checkpoint every 50 steps.

Rank :data:`SLOW_RANK` computes 2x slower from step :data:`STRAGGLER_STEP`; rank :data:`NAN_RANK`
reports a NaN loss at step :data:`NAN_STEP` (only that one value: the run goes on).
"""
from __future__ import annotations

import httpx
import numpy as np

from simulation import Straggler, simulate_run

N_RANKS = 8
SLOW_RANK, STRAGGLER_STEP = 5, 100
NAN_RANK, NAN_STEP = 3, 300
CHECKPOINT_EVERY = 50
FIELDS = ("loss", "grad_norm", "local_grad_norm", "compute_time", "comm_time", "step_time")


def _wire(x: float):
    return x if np.isfinite(x) else ("NaN" if np.isnan(x) else ("Infinity" if x > 0 else "-Infinity"))


def make_trace(n_steps: int, seed: int = 7):
    run = simulate_run(n_steps=n_steps, n_ranks=N_RANKS, seed=seed, warmup_steps=50,
                       faults=[Straggler(step=STRAGGLER_STEP, rank=SLOW_RANK, factor=2.0)])
    block = run.block
    if n_steps > NAN_STEP:
        block.values["loss"][NAN_STEP, NAN_RANK] = np.nan
    return block


def push_steps(http: httpx.Client, run_id: str, block, lo: int, hi: int, batch_steps: int = 25) -> None:
    """Push steps ``lo..hi-1`` of the trace (and the checkpoints among them)."""
    for s0 in range(lo, hi, batch_steps):
        s1 = min(hi, s0 + batch_steps)
        steps = np.repeat(np.arange(s0, s1), N_RANKS)
        ranks = np.tile(np.arange(N_RANKS), s1 - s0)
        cols = {"step": steps.tolist(), "rank": ranks.tolist(),
                "host": [f"node{r // 4}" for r in ranks.tolist()]}
        for f in FIELDS:
            cols[f] = [_wire(v) for v in block.values[f][s0:s1].reshape(-1).tolist()]
        http.post(f"/v1/runs/{run_id}/metrics", json={"columns": cols}).raise_for_status()
        for s in range(s0, s1):
            if s > 0 and s % CHECKPOINT_EVERY == 0:
                http.post(f"/v1/runs/{run_id}/checkpoints",
                          json={"step": s, "uri": f"file:///ckpt/{run_id}/step{s}", "duration_s": 4.0,
                                "bytes": 2_000_000_000}).raise_for_status()
