"""Pushes queued together are fed to a run's monitor as one batch (``healthsvc.monitor.coalesce``):
the records and the order of every run's inputs are kept, and the findings are those of feeding
the pushes one by one (a non-finite value's origin is named at least as precisely)."""
from __future__ import annotations

import numpy as np
import pytest

from simulation import CorruptRank, LossSpike, NonFinite, Straggler, simulate_run
from healthsvc.store.batch import MetricBatch
from healthsvc.messages import Drain, Tick
from healthsvc.monitor import coalesce
from healthsvc.monitor.run_monitor import RunMonitor
from healthsvc.store.results import IngestResult, RunEvent
from healthsvc.store.runstate import RunView


def record(step: int, rank: int, loss: float | None, host: str | None = None,
           digest: str | None = None) -> MetricBatch:
    b = MetricBatch(np.array([step]), np.array([rank]))
    if loss is not None or rank % 2:
        b.values["loss"] = np.array([np.nan if loss is None else loss])
        b.present["loss"] = np.array([loss is not None])
    if host is not None:
        b.host_names, b.host_index = [host], np.array([0], np.int32)
    if digest is not None:
        b.labels["param_digest"] = ([digest], np.array([0], np.int32))
    return b


def test_concat_keeps_every_record_with_its_values_hosts_and_labels():
    parts = [record(1, 0, 2.0, "a", "x"), record(1, 1, None, None, None), record(2, 0, float("nan"), "b", "y"),
             record(2, 1, 3.0, "a", None), record(1, 0, 4.0, None, "x")]
    both = MetricBatch.concat(parts)
    assert both.steps.tolist() == [1, 1, 2, 2, 1] and both.ranks.tolist() == [0, 1, 0, 1, 0]
    # Not reported (a part without the field, or null) stays apart from a reported NaN.
    assert both.present["loss"].tolist() == [True, False, True, True, True]
    assert np.isnan(both.values["loss"][[1, 2]]).all() and both.values["loss"][[0, 3, 4]].tolist() == [2.0, 3.0, 4.0]
    hosts = np.array(both.host_names + [None], dtype=object)[both.host_index].tolist()
    assert hosts == ["a", None, "b", "a", None]
    assert both.label_column("param_digest") == ["x", None, "y", None, "x"]
    assert MetricBatch.concat(parts[:1]) is parts[0]
    slim = MetricBatch.concat(parts, without=frozenset({"param_digest"}))
    assert "param_digest" not in slim.labels and slim.host_index.tolist() == both.host_index.tolist()


def test_concat_of_a_field_every_part_reported_whole_is_a_fresh_all_true_mask():
    # Every part reported loss for every record (their partial_fields say so): the mask is
    # made whole, not joined; it is the batch's own (writable), whatever the parts' size.
    for sizes in ((1, 1, 1), (64, 64), (40_000, 40_000)):
        parts = [MetricBatch(np.arange(n), np.zeros(n, np.int64), {"loss": np.ones(n)}, {"loss": np.ones(n, bool)})
                 for n in sizes]
        both = MetricBatch.concat(parts, only=frozenset({"loss"}))
        assert both.present["loss"].all() and len(both.present["loss"]) == sum(sizes)
        both.present["loss"][0] = False   # its own array
        assert MetricBatch.concat(parts, only=frozenset({"loss"})).present["loss"].all()
    # A part with a record that did not report it: joined, False there.
    gap = np.ones(64, bool)
    gap[5] = False
    parts.append(MetricBatch(np.arange(64), np.ones(64, np.int64), {"loss": np.where(gap, 1.0, np.nan)}, {"loss": gap}))
    assert np.flatnonzero(~MetricBatch.concat(parts).present["loss"]).tolist() == [80_005]


def push(run_id: str, step: int, attempt: int = 1, chunk_id: int = 0) -> IngestResult:
    return IngestResult(run_id, 1, False, attempt, False, chunk_id, float(step), record(step, 0, 1.0),
                        RunView(attempt, 0, 1, False))


def test_pushes_are_grouped_per_run_and_attempt_in_order_and_never_cross_another_input():
    a1, b1, a2, a2x, b2 = push("a", 1), push("b", 1), push("a", 2), push("a", 3, attempt=2), push("b", 2)
    hb, tick, drain, a4, b3 = RunEvent("a", "heartbeat", {}, 5.0), Tick(6.0), Drain(), push("a", 4, 2), push("b", 3)
    items = [a1, b1, a2, a2x, b2, hb, a4, tick, b3, drain]
    assert coalesce.group_pushes(items) == [[a1, a2], [b1, b2], [a2x], hb, [a4], tick, [b3], drain]


def test_merged_pushes_carry_the_newest_chunk_time_and_run_state():
    pushes = [push("a", s, chunk_id=10 + s) for s in (3, 1, 2)]
    one = coalesce.merged(pushes)
    assert (one.chunk_id, one.received_at, one.accepted) == (13, 2.0, 3)
    assert one.batch.steps.tolist() == [3, 1, 2] and one.run is pushes[-1].run


def per_rank_pushes(seed: int):
    """A simulated run with faults, as every rank's own push of every step (two steps a second)."""
    faults = [Straggler(300, 5, 1.6), LossSpike(500, factor=3.0), NonFinite(700, 3), CorruptRank(800, 2)]
    block = simulate_run(n_steps=1000, n_ranks=8, seed=seed, faults=faults, missing_fraction=0.01).block
    for i, s in enumerate(block.steps.tolist()):
        for r in block.ranks.tolist():
            b = MetricBatch(np.array([s]), np.array([r]),
                            {m: v[i, r:r + 1].copy() for m, v in block.values.items()},
                            {m: p[i, r:r + 1].copy() for m, p in block.present.items()})
            yield IngestResult("run", 1, False, 1, False, None, 1000.0 + 0.5 * s + 0.001 * r, b,
                               RunView(1, 0, 8, False))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_monitor_fed_queued_pushes_together_finds_what_it_finds_fed_one_by_one(seed):
    pushes = list(per_rank_pushes(seed))
    one_by_one, together = RunMonitor("run", {}), RunMonitor("run", {})
    found_alone = [f for p in pushes for f in one_by_one.on_metrics(p.batch, p.run, p.chunk_id, p.received_at)]
    found_together, at, rng = [], 0, np.random.default_rng(seed)
    while at < len(pushes):
        n = int(rng.integers(1, 40))   # what the queue held when the monitor woke
        p = coalesce.merged(pushes[at:at + n])
        found_together += together.on_metrics(p.batch, p.run, p.chunk_id, p.received_at)
        at += n
    for mon, found in ((one_by_one, found_alone), (together, found_together)):
        found += mon.on_finish(pushes[-1].received_at)
    assert {f.kind for f in found_alone} >= {"non_finite", "straggler"}
    # Every fault at the same step, in the same metric; nothing found that was not found alone.
    # (One difference is allowed, and better: a NaN gradient norm that every rank reports,
    # judged on a push that also holds the rank it came from, names that rank; judged on each
    # rank's push alone, it is first run-wide.)
    assert {(f.kind, f.metric, f.step) for f in found_together} == {(f.kind, f.metric, f.step) for f in found_alone}
    assert {f.identity for f in found_together} <= {f.identity for f in found_alone}
