"""The monitor's snapshot text (``monitor.hub._dump_state``): whatever the state holds (NaN and
infinities, which orjson would write as null; int keys and huge ints, which it refuses), the
json module reads it back equal, NaN as NaN; a state without such values is written by orjson."""
from __future__ import annotations

import json
import math

import orjson

from healthsvc.monitor.hub import _dump_state


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_the_monitor_state_reads_back_equal_whatever_it_holds():
    plain = {"attempt": 3, "saved_at": 1.5e9, "finished": False, "world_size": None,
             "aligner": {"values": {"loss": [1.0, 2.5, 1e-05, -0.0]}, "steps": [1, 2, 3, 4]},
             "detectors": {"spike": {"mean": [0.1, "nan", "-inf"], "n": 12}}}
    assert _dump_state(plain) == orjson.dumps(plain)          # the fast text
    assert _same(json.loads(_dump_state(plain)), plain)
    for odd in ({"x": [1.0, float("nan")]}, {"x": float("inf")}, {"x": {"y": [float("-inf")]}},
                {"x": 2 ** 70}, {"x": {1: 2.0}}):
        state = {**plain, **odd}
        back = json.loads(_dump_state(state))
        want = json.loads(json.dumps(state, allow_nan=True))   # what the json module alone kept
        assert _same(back, want), odd
        assert _dump_state(state) == json.dumps(state, allow_nan=True, separators=(",", ":")).encode()
