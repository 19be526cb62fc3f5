"""NonFiniteDetector: exact step, origin ranks, once per (metric, rank), missing is not NaN."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.non_finite import NonFiniteDetector
from simulation import NonFinite, iter_blocks, simulate_run


def feed(det, blocks):
    return [f for b in blocks for f in det.update(b)]


def by_metric(findings):
    return {(f.metric, f.step): f for f in findings}


def test_nan_on_one_rank_is_reported_at_its_step_with_the_origin_rank():
    run = simulate_run(n_steps=2_000, n_ranks=64, seed=11, faults=[NonFinite(step=1_234, rank=37)])
    found = by_metric(feed(NonFiniteDetector(), iter_blocks(run.block, 50)))
    origin = found[("local_grad_norm", 1_234)]
    assert origin.ranks == (37,) and origin.severity == "critical" and origin.score == 1.0
    assert origin.evidence["role"] == "origin" and origin.evidence["values"] == ["nan"]
    # The all-reduce spreads it to every rank at the same step: blamed on the origin.
    spread = found[("grad_norm", 1_234)]
    assert spread.ranks == (37,)
    assert spread.evidence["role"] == "spread" and spread.evidence["affected_count"] == 64
    assert spread.evidence["origin_step"] == 1_234
    # Next step every rank's loss is NaN (poisoned weights): still the origin's fault.
    loss = found[("loss", 1_235)]
    assert loss.ranks == (37,) and loss.evidence["affected_count"] == 64 and loss.onset_step == 1_234
    assert sorted(found) == [("grad_norm", 1_234), ("local_grad_norm", 1_234),
                             ("local_grad_norm", 1_235), ("loss", 1_235)]


def test_loss_overflow_and_infinity_are_named_by_kind():
    run = simulate_run(n_steps=600, n_ranks=16, seed=3,
                       faults=[NonFinite(step=400, rank=2, value=float("inf"), in_loss=True)])
    found = by_metric(NonFiniteDetector().update(run.block))
    assert found[("loss", 400)].ranks == (2,) and found[("loss", 400)].evidence["values"] == ["inf"]
    assert found[("local_grad_norm", 400)].evidence["role"] == "origin"
    assert found[("grad_norm", 400)].evidence["values"] == ["inf"]


def test_two_origin_ranks_at_the_same_step_are_both_named():
    run = simulate_run(n_steps=300, n_ranks=32, seed=5,
                       faults=[NonFinite(step=200, rank=4), NonFinite(step=200, rank=21)])
    found = by_metric(NonFiniteDetector().update(run.block))
    assert found[("local_grad_norm", 200)].ranks == (4, 21)
    assert found[("grad_norm", 200)].ranks == (4, 21)


def test_each_metric_and_rank_fires_once_across_blocks():
    run = simulate_run(n_steps=1_000, n_ranks=8, seed=1, faults=[NonFinite(step=100, rank=3)])
    det = NonFiniteDetector()
    first = feed(det, iter_blocks(run.block.slice_steps(0, 300), 7))
    assert first
    assert feed(det, iter_blocks(run.block.slice_steps(300, 1_000), 13)) == []


def test_global_nan_without_local_values_blames_nobody():
    run = simulate_run(n_steps=300, n_ranks=16, seed=2, faults=[NonFinite(step=250, rank=9)],
                       metrics=("grad_norm", "step_time"))
    [f] = NonFiniteDetector().update(run.block)
    assert (f.metric, f.step, f.ranks, f.evidence["role"]) == ("grad_norm", 250, (), "unknown_origin")


def test_global_value_non_finite_on_one_rank_only_blames_that_rank():
    g = np.ones((5, 16))
    g[3, 6] = np.nan
    [f] = NonFiniteDetector().update(StepBlock.from_dense(np.arange(5), np.arange(16), grad_norm=g))
    assert (f.step, f.ranks, f.evidence["role"]) == (3, (6,), "local")


def test_timing_metric_nan_is_reported_on_its_rank_not_blamed_on_the_origin():
    loss = np.ones((6, 4))
    loss[1, 0] = np.nan
    st = np.ones((6, 4))
    st[4, 2] = -np.inf
    found = NonFiniteDetector().update(StepBlock.from_dense(np.arange(6), np.arange(4), loss=loss, step_time=st))
    assert [(f.metric, f.step, f.ranks, f.evidence["role"]) for f in found] == [
        ("loss", 1, (0,), "origin"), ("step_time", 4, (2,), "local")]
    assert found[1].evidence["values"] == ["-inf"]


def test_missing_cells_are_never_non_finite():
    run = simulate_run(n_steps=500, n_ranks=32, seed=4, missing_fraction=0.2)
    assert all(np.isnan(v[~p]).all() for v, p in zip(run.block.values.values(), run.block.present.values()))
    assert NonFiniteDetector().update(run.block) == []


def test_a_rank_that_appears_later_fires_for_its_own_first_nan():
    det = NonFiniteDetector()
    det.update(StepBlock.from_dense([0, 1], [0, 1], loss=[[np.nan, 1.0], [np.nan, 1.0]]))
    [f] = det.update(StepBlock.from_dense([2], [0, 1, 5], loss=[[np.nan, 1.0, np.nan]]))
    assert (f.step, f.evidence["affected_ranks"], f.ranks, f.evidence["role"]) == (2, [5], (0,), "spread")


def test_only_watched_metrics_are_checked():
    run = simulate_run(n_steps=200, n_ranks=8, seed=1, faults=[NonFinite(step=50, rank=1)])
    found = NonFiniteDetector(metrics=("grad_norm",)).update(run.block)
    # Without local metrics watched the origin is unknown.
    assert [(f.metric, f.step, f.ranks) for f in found] == [("grad_norm", 50, ())]


@pytest.mark.parametrize("cut", [1, 1_233, 1_234, 1_235, 1_900])
def test_state_round_trip_through_json(cut):
    run = simulate_run(n_steps=2_000, n_ranks=16, seed=11, faults=[NonFinite(step=1_234, rank=7)])
    whole = NonFiniteDetector().update(run.block)
    first = NonFiniteDetector()
    head = first.update(run.block.slice_steps(0, cut))
    restored = NonFiniteDetector()
    restored.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))
    assert head + restored.update(run.block.slice_steps(cut, 2_000)) == whole


def test_the_example_in_the_docs_prints_what_it_says(capsys):
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "detectors-values.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    expected = [line[2:] for line in code.splitlines() if line.startswith("# ")]
    exec(compile(code, "docs/detectors-values.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == expected
