"""Properties of the timing detectors: split anywhere, permute ranks, constant input, missing
values, state round trips. Each property is checked on traces where the detector *does* fire and
resolve, so "same findings" compares something."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.hang import HangDetector
from simulation import Straggler, iter_blocks, simulate_run, split_at
from healthsvc_detectors.slowdown import SlowdownDetector
from healthsvc_detectors.straggler import StragglerDetector

N_STEPS = 1500
FAST = settings(max_examples=12, deadline=None, derandomize=True)


def _straggler_trace() -> StepBlock:
    # Rank 6 at 1.3x from 400, recovered at 900, 1.1x rank 20 from 1000: fire, resolve, fire.
    run = simulate_run(n_steps=N_STEPS, n_ranks=32, seed=21,
                       faults=[Straggler(step=400, rank=6), Straggler(step=1000, rank=20, factor=1.1)])
    run.block.values["compute_time"][900:, 6] /= 1.3
    return run.block


def _slowdown_trace() -> StepBlock:
    run = simulate_run(n_steps=N_STEPS, n_ranks=32, seed=22)
    run.block.values["step_time"][700:1100] *= 1.3
    return run.block


def _with_ts(block: StepBlock) -> StepBlock:
    """The trainer's clock (``ts``): each step's median step time accumulated, on every rank."""
    st = block.values["step_time"]
    ts = 1_000.0 + np.cumsum(np.nanmedian(np.where(block.present["step_time"], st, np.nan), axis=1))
    block.values["ts"] = np.repeat(ts[:, None], block.n_ranks, axis=1)
    block.present["ts"] = np.ones(st.shape, dtype=bool)
    return block


def _slowdown_ts_trace() -> StepBlock:
    # 1.3x for 800 steps (~550 s of trainer time): info, then a page after 300 s, then resolved.
    run = simulate_run(n_steps=N_STEPS, n_ranks=32, seed=22)
    run.block.values["step_time"][500:1300] *= 1.3
    return _with_ts(run.block)


TRACES = {
    "straggler": (StragglerDetector, _straggler_trace()),
    "slowdown": (SlowdownDetector, _slowdown_trace()),
    # With the trainer's clock the episodes carry an info -> page transition whose state (when it
    # fired, since when it is slow) must survive splits, permutations and round trips too.
    "straggler+ts": (StragglerDetector, _with_ts(_straggler_trace())),
    "slowdown+ts": (SlowdownDetector, _slowdown_ts_trace()),
}
EXPECTED = {"straggler": [("firing", (6,), "warning"), ("resolved", (6,), "info"), ("firing", (20,), "warning")],
            "slowdown": [("firing", (), "warning"), ("resolved", (), "info")],
            "straggler+ts": [("firing", (6,), "info"), ("firing", (6,), "warning"), ("resolved", (6,), "info"),
                             ("firing", (20,), "info"), ("firing", (20,), "warning")],
            "slowdown+ts": [("firing", (), "info"), ("firing", (), "warning"), ("resolved", (), "info")]}


def _shape(findings):
    return [(f.status, f.ranks, f.severity) for f in findings]


def _feed(det, blocks):
    out = []
    for b in blocks:
        out += det.update(b)
    return out


@pytest.fixture(scope="module")
def reference():
    return {name: cls().update(block) for name, (cls, block) in TRACES.items()}


def test_the_property_traces_fire_and_resolve(reference):
    for name, out in reference.items():
        assert _shape(out) == EXPECTED[name]


@pytest.mark.parametrize("name", list(TRACES))
@FAST
@given(cuts=st.lists(st.integers(1, N_STEPS - 1), max_size=12))
def test_splitting_the_input_anywhere_gives_the_same_findings(reference, name, cuts):
    cls, block = TRACES[name]
    assert _feed(cls(), split_at(block, cuts)) == reference[name]


@pytest.mark.parametrize("name", list(TRACES))
@pytest.mark.parametrize("sizes", [1, (1, 2, 3, 64), 333])
def test_streaming_one_step_at_a_time_or_in_bursts_gives_the_same_findings(reference, name, sizes):
    cls, block = TRACES[name]
    assert _feed(cls(), iter_blocks(block, sizes)) == reference[name]


@pytest.mark.parametrize("name", list(TRACES))
def test_permuting_ranks_in_every_block_changes_nothing(reference, name):
    cls, block = TRACES[name]
    rng = np.random.default_rng(5)
    blocks = [b.take_ranks(rng.permutation(b.n_ranks)) for b in iter_blocks(block, seed=1)]
    assert _feed(cls(), blocks) == reference[name]


def test_permutation_of_rank_ids_moves_the_blame_with_the_id():
    _, block = TRACES["straggler"]
    relabel = np.arange(32)[::-1] + 100       # rank r becomes 131 - r
    renamed = StepBlock(steps=block.steps, ranks=relabel, values=block.values, present=block.present)
    out = StragglerDetector().update(renamed)
    assert [f.ranks for f in out] == [(125,), (125,), (111,)]


@pytest.mark.parametrize("cls", [StragglerDetector, SlowdownDetector])
@FAST
@given(value=st.floats(1e-3, 1e3), n_ranks=st.integers(1, 40))
def test_constant_series_never_fire(cls, value, n_ranks):
    shape = (600, n_ranks)
    block = StepBlock.from_dense(np.arange(600), np.arange(n_ranks), compute_time=np.full(shape, value),
                                 step_time=np.full(shape, 2 * value), comm_time=np.full(shape, value))
    assert _feed(cls(), iter_blocks(block, (1, 17, 64))) == []


@pytest.mark.parametrize("name", list(TRACES))
@pytest.mark.parametrize("filler", [np.nan, 0.0, 1e9, -5.0])
def test_missing_values_are_ignored_whatever_the_filler(name, filler):
    cls, block = TRACES[name]
    rng = np.random.default_rng(3)
    values, present = {}, {}
    for m, v in block.values.items():
        hole = rng.random(v.shape) < 0.05
        present[m] = block.present[m] & ~hole
        values[m] = np.where(hole, filler, v)
    holed = StepBlock(steps=block.steps, ranks=block.ranks, values=values, present=present)
    nan_filled = StepBlock(steps=block.steps, ranks=block.ranks,
                           values={m: np.where(present[m], v, np.nan) for m, v in values.items()},
                           present=present)
    out = cls().update(holed)
    assert out == cls().update(nan_filled)
    assert _shape(out) == EXPECTED[name]


def _holed(block: StepBlock, share: float = 0.1, seed: int = 3) -> StepBlock:
    rng = np.random.default_rng(seed)
    present = {m: p & ~(rng.random(p.shape) < share) for m, p in block.present.items()}
    return StepBlock(steps=block.steps, ranks=block.ranks, present=present,
                     values={m: np.where(present[m], v, np.nan) for m, v in block.values.items()})


@pytest.mark.parametrize("name", list(TRACES))
@pytest.mark.parametrize("seed", [0, 1])
def test_splitting_input_with_missing_values_gives_the_same_findings(name, seed):
    cls, block = TRACES[name]
    holed = _holed(block)
    ref = cls().update(holed)
    assert _shape(ref) == EXPECTED[name]
    assert _feed(cls(), iter_blocks(holed, seed=seed, max_size=97)) == ref


def test_a_rank_missing_for_a_long_stretch_is_neither_fast_nor_slow():
    _, block = TRACES["straggler"]
    present = {m: p.copy() for m, p in block.present.items()}
    for p in present.values():
        p[200:800, 11] = False                  # absent, not zero
    gone = StepBlock(steps=block.steps, ranks=block.ranks, values=block.values, present=present)
    assert _shape(StragglerDetector().update(gone)) == EXPECTED["straggler"]


@pytest.mark.parametrize("name", list(TRACES))
@FAST
@given(cut=st.integers(1, N_STEPS - 1))
def test_state_round_trips_anywhere(reference, name, cut):
    cls, block = TRACES[name]
    det = cls()
    first = det.update(block.slice_steps(0, cut))
    fresh = cls()
    fresh.load_state_dict(json.loads(json.dumps(det.state_dict())))
    assert first + fresh.update(block.slice_steps(cut, N_STEPS)) == reference[name]


# ------------------------------------------------------------------------------------ hang
def _hang_script(n_ranks: int = 24):
    """(now, kind, payload) events: pushes every second, rank 7 silent 100-200 s, all silent
    300-400 s, heartbeats from 300 s naming rank 2 outside the collective, ticks every second."""
    events = []
    steps = np.zeros(n_ranks, dtype=np.int64)
    for t in range(1, 460):
        now = float(t)
        alive = np.ones(n_ranks, dtype=bool)
        if 100 <= t < 200:
            alive[7] = False
        if 300 <= t < 400:
            alive[:] = False
        ranks = np.flatnonzero(alive)
        if t == 200:
            steps[7] = steps.max()              # synchronous training: it rejoins the others
        steps[ranks] += 1
        if len(ranks):
            events.append((now, "observe", (ranks, steps[ranks].copy())))
        if 300 <= t < 400 and t % 3 == 0:
            for r in range(n_ranks):
                events.append((now, "heartbeat", (r, int(steps[r]) + 1, "data" if r == 2 else "collective")))
        events.append((now, "tick", None))
    return events


def _play(det: HangDetector, events, transform=lambda kind, payload: [payload]):
    out = []
    for now, kind, payload in events:
        if kind == "tick":
            out += [(now, f) for f in det.tick(now)]
        elif kind == "heartbeat":
            out += [(now, f) for f in det.heartbeat(*payload, now)]
        else:
            for ranks, steps in transform(kind, payload):
                out += [(now, f) for f in det.observe(ranks, steps, now)]
    return out


HANG_EVENTS = _hang_script()


def _new_hang():
    det = HangDetector(timeout_floor_s=5.0)
    det.set_world(range(24), 0.0)
    return det


@pytest.fixture(scope="module")
def hang_reference():
    return _play(_new_hang(), HANG_EVENTS)


def test_the_hang_script_fires_hang_stall_and_culprit(hang_reference):
    assert [(t, f.kind, f.status, f.ranks) for t, f in hang_reference] == [
        (110.0, "hang", "firing", (7,)), (200.0, "hang", "resolved", (7,)),
        (310.0, "stall", "firing", ()), (310.0, "hang", "firing", (2,)),
        (400.0, "stall", "resolved", ()), (400.0, "hang", "resolved", (2,))]


@FAST
@given(seed=st.integers(0, 2**31 - 1))
def test_hang_splitting_a_push_into_several_calls_changes_nothing(hang_reference, seed):
    rng = np.random.default_rng(seed)

    def split(kind, payload):
        ranks, steps = payload
        cuts = np.sort(rng.integers(0, len(ranks) + 1, size=rng.integers(0, 4)))
        return [(r, s) for r, s in zip(np.split(ranks, cuts), np.split(steps, cuts)) if len(r)]
    assert _play(_new_hang(), HANG_EVENTS, split) == hang_reference


@FAST
@given(seed=st.integers(0, 2**31 - 1))
def test_hang_permuting_ranks_in_a_push_changes_nothing(hang_reference, seed):
    rng = np.random.default_rng(seed)

    def permute(kind, payload):
        ranks, steps = payload
        order = rng.permutation(len(ranks))
        return [(ranks[order], steps[order])]
    assert _play(_new_hang(), HANG_EVENTS, permute) == hang_reference


@FAST
@given(interval_s=st.floats(0.01, 100.0), n_ranks=st.integers(1, 64))
def test_regular_pushes_never_fire(interval_s, n_ranks):
    det = HangDetector(timeout_floor_s=1.0)
    ranks = np.arange(n_ranks)
    for i in range(1, 300):
        now = i * interval_s
        assert det.observe(ranks, np.full(n_ranks, i), now) == []
        assert det.tick(now + 0.9 * interval_s) == []


@FAST
@given(cut=st.integers(0, len(HANG_EVENTS) - 1))
def test_hang_state_round_trips_anywhere(hang_reference, cut):
    det = _new_hang()
    out = _play(det, HANG_EVENTS[:cut])
    fresh = HangDetector(timeout_floor_s=5.0)
    fresh.load_state_dict(json.loads(json.dumps(det.state_dict())))
    assert out + _play(fresh, HANG_EVENTS[cut:]) == hang_reference
