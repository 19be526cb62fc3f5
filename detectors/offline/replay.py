"""The verdict of a replay probe: one step's gradient norm recomputed on the same fixed batch by a
suspect rank and by a healthy one.

Same inputs, same weights, same code: a healthy device gives the same number (deterministic CPU
kernels bit for bit; GPUs within a few ulps), so agreement within ``rtol`` clears the suspect's
hardware (the data or the code made its values odd), and disagreement blames it (its compute, or
the state in its memory, as after a flipped bit). Two NaNs agree; a NaN against a number does not.

>>> judge_replay(1.2345, 1.2345)
'data_or_code'
>>> judge_replay(1.2345, 9.87)
'hardware'
"""
from __future__ import annotations

import math
from typing import Literal

Verdict = Literal["data_or_code", "hardware"]
REPLAY_RTOL = 1e-5


def judge_replay(suspect: float, healthy: float, rtol: float = REPLAY_RTOL) -> Verdict:
    if math.isnan(suspect) or math.isnan(healthy):
        return "data_or_code" if math.isnan(suspect) and math.isnan(healthy) else "hardware"
    if suspect == healthy or abs(suspect - healthy) <= rtol * max(abs(suspect), abs(healthy)):
        return "data_or_code"
    return "hardware"
