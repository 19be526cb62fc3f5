"""The monitor's snapshot text (``monitor.hub._dump_state``): a real run monitor's state, fed
NaN and infinities that its aligner still holds and its detectors have seen, is strict JSON (the
contract that lets orjson write it as it is: orjson would write a raw NaN as null), and a monitor
restored from the text finds what the original finds afterwards; what orjson refuses (int keys,
huge ints) the json module writes. At 96 ranks the detectors' per-rank arrays are written as
their bytes (``stats.state_json``), at 8 as lists: the same holds for both."""
from __future__ import annotations

import json

import numpy as np
import orjson

import pytest

from healthsvc.monitor.hub import _dump_state, _load_state, _snapshot_blob
from healthsvc.monitor.run_monitor import RunMonitor
from healthsvc.store.batch import MetricBatch
from healthsvc.store.runstate import RunView

def batch(step: int, ranks, loss) -> MetricBatch:
    ranks = np.asarray(ranks)
    loss = np.asarray(loss, float)
    present = {"loss": np.ones(len(ranks), bool), "grad_norm": np.ones(len(ranks), bool)}
    return MetricBatch(np.full(len(ranks), step), ranks, {"loss": loss, "grad_norm": np.full(len(ranks), 1.0)},
                       present)


@pytest.mark.parametrize("RANKS", [8, 96])
def test_a_monitor_state_with_nan_and_infinity_is_strict_json_and_restores_the_same_monitor(RANKS):
    mon = RunMonitor("r", {"world_size": RANKS})
    for step in range(60):
        loss = np.full(RANKS, 2.0 - step / 100)
        if step == 40:
            loss[3], loss[5] = np.nan, np.inf                     # seen by the detectors
        mon.on_metrics(batch(step, range(RANKS), loss), RunView(1, 0, RANKS, False), step + 1, float(step))
    # A step the aligner still holds, half its ranks in, NaN and -inf among them.
    mon.on_metrics(batch(60, range(4), [np.nan, -np.inf, 1.4, 1.4]), RunView(1, 0, RANKS, False), 61, 60.0)
    state = mon.state_dict()
    assert state["aligner"]["values"]["loss"][:2] == ["nan", "-inf"]   # held, as strings
    strict = json.dumps(state, allow_nan=False)                  # raises on a raw NaN or infinity
    text = _dump_state(state)
    assert text == orjson.dumps(state) and json.loads(text) == json.loads(strict)
    # Stored compressed; the text as stored before loads the same.
    blob = _snapshot_blob(state)
    assert blob[:1] != b"{" and len(blob) < len(text) and _load_state(blob) == _load_state(text) == json.loads(strict)
    again = RunMonitor("r", {"world_size": RANKS})
    again.load_state_dict(_load_state(blob))
    assert json.dumps(again.state_dict(), allow_nan=False) == strict
    rest = [batch(60, range(4, RANKS), [1.4] * (RANKS - 4))]
    rest += [batch(s, range(RANKS), [np.inf if s == 75 and r == 2 else 1.4 for r in range(RANKS)])
             for s in range(61, 90)]
    found = [[(f.kind, f.step, f.ranks) for f in m.on_metrics(b, RunView(1, 0, RANKS, False), int(b.steps[0]) + 2,
                                                            float(b.steps[0]))]
             for b in rest for m in (mon, again)]
    assert found[0::2] == found[1::2]
    assert ("non_finite", 75) in [f[:2] for step in found[0::2] for f in step]


def test_what_orjson_refuses_is_written_by_the_json_module():
    plain = {"attempt": 3, "saved_at": 1.5e9, "finished": False, "world_size": None,
             "detectors": {"spike": {"mean": [0.1, "nan", "-inf"], "n": 12}}}
    assert _dump_state(plain) == orjson.dumps(plain)
    for odd in ({"x": 2 ** 70}, {"x": {1: 2.0}}):
        state = {**plain, **odd}
        assert _dump_state(state) == json.dumps(state, allow_nan=True, separators=(",", ":")).encode()
