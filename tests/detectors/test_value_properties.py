"""Properties every value detector keeps: split anywhere, permute ranks, constants, missing, state.

One faulty trace carries every value fault at once (plus 10 % missing cells), so each property is
exercised while detectors are firing, escalating and resolving, not only on quiet input.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.divergence import DivergenceDetector
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.non_finite import NonFiniteDetector
from healthsvc_detectors.rank_outlier import RankOutlierDetector
from simulation import (CorruptRank, Divergence, GradSpike, LossSpike, NonFinite,
                        iter_blocks, simulate_run, split_at)
from healthsvc_detectors.spike import GradSpikeDetector, LossSpikeDetector

FACTORIES = {
    "non_finite": NonFiniteDetector,
    "loss_spike": LossSpikeDetector,
    "grad_spike": GradSpikeDetector,
    "divergence": lambda: DivergenceDetector(warmup_steps=150),
    "rank_outlier": lambda: RankOutlierDetector(escalate_steps=100),
}
FAULTS = [
    LossSpike(step=400, factor=2.0), LossSpike(step=450, factor=3.0, ranks=(3, 11), duration=30),
    GradSpike(step=600, factor=8.0), LossSpike(step=700, factor=2.0, duration=40),
    CorruptRank(step=800, rank=5, loss_scale=1.1), CorruptRank(step=900, rank=17, local_grad_scale=1.0, grad_norm_scale=1.2),
    Divergence(step=1_000, rate=1e-3), NonFinite(step=1_450, rank=9),
]


@pytest.fixture(scope="module")
def faulty() -> StepBlock:
    return simulate_run(n_steps=1_500, n_ranks=24, seed=21, faults=FAULTS, missing_fraction=0.1).block


def feed(det, blocks):
    return [f for b in blocks for f in det.update(b)]


def kinds_fired(findings):
    return {(f.kind, f.status) for f in findings}


@pytest.fixture(scope="module")
def whole(faulty):
    return {name: feed(make(), [faulty]) for name, make in FACTORIES.items()}


def test_the_faulty_trace_exercises_every_detector(whole):
    for name, found in whole.items():
        assert (name, "firing") in kinds_fired(found), name
    assert any(f.severity == "critical" for name in ("loss_spike", "rank_outlier", "divergence") for f in whole[name])
    assert any(f.status == "resolved" for f in whole["loss_spike"])
    # The severity policy's states all occur (so split/permute/state properties cover them): a
    # transient spike (info), a large one, one that lasts, one that escalates; and the per-rank
    # views (each rank against its own history, with 10 % of cells missing) are live.
    spikes = whole["loss_spike"] + whole["grad_spike"]
    assert {"transient", "large", "lasting", "not recovering", "recovered"} <= {f.evidence.get("reason") for f in spikes}
    assert {"info", "warning", "critical"} <= {f.severity for f in spikes if f.status == "firing"}
    assert {"job", "ranks"} <= {f.evidence.get("scope") for f in spikes}
    assert {"loss", "local_grad_norm", "grad_norm"} <= {f.metric for f in whole["rank_outlier"] if f.status == "firing"}


@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_splitting_the_input_anywhere_gives_the_same_findings(name, seed, faulty, whole):
    assert feed(FACTORIES[name](), iter_blocks(faulty, seed=seed, max_size=97)) == whole[name]


@pytest.mark.parametrize("name", FACTORIES)
def test_one_step_blocks_and_cuts_at_fault_steps_give_the_same_findings(name, faulty, whole):
    assert feed(FACTORIES[name](), iter_blocks(faulty.slice_steps(0, 720), 1)) == \
        [f for f in whole[name] if f.step < 720]
    cuts = [399, 400, 401, 450, 451, 600, 601, 701, 702, 800, 802, 1_000, 1_449, 1_450, 1_451]
    assert feed(FACTORIES[name](), split_at(faulty, cuts)) == whole[name]


@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_permuting_ranks_changes_nothing(name, seed, faulty, whole):
    order = np.random.default_rng(seed).permutation(faulty.n_ranks)
    assert feed(FACTORIES[name](), iter_blocks(faulty.take_ranks(order), 64)) == whole[name]


@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("value", [1e-6, 1.0, 2.5, 1e6])
def test_a_constant_series_never_fires(name, value):
    metrics = ("loss", "grad_norm", "local_grad_norm", "step_time", "compute_time", "comm_time")
    block = StepBlock.from_dense(np.arange(2_000), np.arange(32),
                                 **{m: np.full((2_000, 32), value) for m in metrics})
    assert feed(FACTORIES[name](), iter_blocks(block, 50)) == []


@pytest.mark.parametrize("name", FACTORIES)
def test_missing_is_never_a_value(name, faulty, whole):
    # Whatever sits in a cell that was not reported (NaN filler, garbage, infinities) is ignored.
    rng = np.random.default_rng(5)
    garbage = StepBlock(steps=faulty.steps, ranks=faulty.ranks, values={
        m: np.where(faulty.present[m], v, rng.choice([np.nan, np.inf, -np.inf, 0.0, -3.0, 1e9], size=v.shape))
        for m, v in faulty.values.items()}, present={m: p.copy() for m, p in faulty.present.items()})
    assert feed(FACTORIES[name](), iter_blocks(garbage, 64)) == whole[name]
    nothing = StepBlock(steps=faulty.steps, ranks=faulty.ranks, values=garbage.values,
                        present={m: np.zeros_like(p) for m, p in faulty.present.items()})
    assert feed(FACTORIES[name](), iter_blocks(nothing, 64)) == []


@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("cut", [1, 401, 455, 601, 702, 803, 810, 1_100, 1_451])
def test_state_round_trip_mid_stream(name, cut, faulty, whole):
    first = FACTORIES[name]()
    head = feed(first, iter_blocks(faulty.slice_steps(0, cut), 37))
    state = json.loads(json.dumps(first.state_dict(), allow_nan=False))   # strict JSON
    fresh = FACTORIES[name]()
    fresh.load_state_dict(state)
    assert head + feed(fresh, iter_blocks(faulty.slice_steps(cut, faulty.n_steps), 37)) == whole[name]


@pytest.mark.parametrize("name", FACTORIES)
def test_reset_forgets_everything(name, faulty, whole):
    det = FACTORIES[name]()
    feed(det, [faulty])
    det.reset()
    assert feed(det, [faulty]) == whole[name]


@pytest.mark.parametrize("name", FACTORIES)
def test_findings_are_well_formed(name, whole):
    for f in whole[name]:
        assert f.kind == name and 0.0 <= f.score <= 1.0 and f.metric
        assert list(f.ranks) == sorted(set(f.ranks))
        json.dumps(f.to_dict(), allow_nan=False)
        if f.status == "firing" and name != "non_finite":
            assert f.onset_step is None or f.onset_step <= f.step


# ------------------------------------------------------------------ the trace generator itself
def test_simulated_traces_keep_their_promises():
    from simulation import Straggler
    a = simulate_run(n_steps=3_000, n_ranks=64, seed=8, faults=[Straggler(step=1_000, rank=9, factor=1.3)])
    b = simulate_run(n_steps=3_000, n_ranks=64, seed=8, faults=[Straggler(step=1_000, rank=9, factor=1.3)])
    v = a.block.values
    assert all(np.array_equal(v[m], b.block.values[m], equal_nan=True) for m in v)      # seeded
    loss = np.median(v["loss"], axis=1)
    assert loss[:100].mean() > 2 * loss[-100:].mean()                                   # it learns
    assert np.ptp(v["grad_norm"], axis=1).max() == 0.0                                 # global is global
    assert np.ptp(v["step_time"], axis=1).max() < 1e-3                                 # synchronous
    after = slice(1_000, 3_000)
    assert (v["compute_time"][after].argmax(axis=1) == 9).mean() > 0.99                # the straggler
    assert (v["comm_time"][after].argmin(axis=1) == 9).mean() > 0.99                   # waits least
    assert [t.kind for t in a.truth] == ["straggler"] and a.truth[0].ranks == (9,)
    sizes = [blk.n_steps for blk in iter_blocks(a.block, (1, 7, 64))]
    assert sum(sizes) == 3_000 and sizes[:4] == [1, 7, 64, 1]
    assert [blk.n_steps for blk in split_at(a.block, [10, 10, 2_999])] == [10, 2_989, 1]
    masked = simulate_run(n_steps=500, n_ranks=16, seed=1, missing_fraction=0.25).block
    share = np.mean([(~p).mean() for p in masked.present.values()])
    assert 0.2 < share < 0.3 and all(np.isnan(masked.values[m][~masked.present[m]]).all() for m in masked.values)
