"""A simulated run as a trainer pushes it: one columnar request per step, every rank in it."""
from __future__ import annotations

import json

import numpy as np

from healthsvc_detectors.frame import StepBlock

FIELDS = ("loss", "grad_norm", "local_grad_norm", "step_time")


def step_pushes(block: StepBlock, fields: tuple[str, ...] = FIELDS) -> list[bytes]:
    """The body of each step's push (NaN stays a NaN token, as the client sends it)."""
    ranks = block.ranks.tolist()
    out = []
    for i, step in enumerate(block.steps.tolist()):
        cols: dict[str, list] = {"step": [step] * len(ranks), "rank": ranks}
        for f in fields:
            cols[f] = np.asarray(block.values[f][i], dtype=float).tolist()
        out.append(json.dumps({"columns": cols}).encode())
    return out
