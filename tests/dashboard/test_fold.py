"""The dashboard's thread folds what gathered between its wake-ups (``RollupHub.fold_every_s``)
and snapshots a run every ``snapshot_every_s``, the first time too: a fold of many pushes draws
the rollup that one push at a time draws, a drain does not wait out the interval, and a run not
snapshotted yet is rebuilt from its chunks on restart."""
from __future__ import annotations

import numpy as np
import pytest

import gc
import weakref

from healthsvc.dashboard import hub as hub_module
from healthsvc.dashboard.hub import HeldColumns, RollupHub, RunFeed
from healthsvc.store.batch import MetricBatch
from healthsvc.store.open import open_store
from healthsvc.store.results import IngestResult
from healthsvc.store.runstate import RunView

FIELDS = ("loss", "grad_norm", "step_time", "compute_time", "comm_time")


def rank_pushes(seed: int, n_steps: int = 300, n_ranks: int = 24) -> list[MetricBatch]:
    """Pushes of a few ranks' records each, in step order with the ranks shuffled, some values
    non-finite or missing, one rank slow."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n_steps):
        ranks = rng.permutation(n_ranks)
        for part in np.array_split(ranks, rng.integers(1, 5)):
            n = len(part)
            b = MetricBatch(np.full(n, s), part.astype(np.int64))
            for f in FIELDS:
                v = 1.0 + 0.1 * rng.standard_normal(n) + (part == 3) * (f == "compute_time")
                v[rng.random(n) < 0.02] = np.nan
                b.values[f], b.present[f] = v, rng.random(n) > 0.03
            out.append(b)
    return out


def results(pushes: list[MetricBatch]) -> list[IngestResult]:
    n_ranks = int(max(b.ranks.max() for b in pushes)) + 1
    return [IngestResult("r", len(b), False, 1, False, k + 1, 1000.0 + k * 1e-3, b, RunView(1, 0, n_ranks, False))
            for k, b in enumerate(pushes)]


def rollup_arrays(feed: RunFeed) -> dict[str, np.ndarray]:
    """What the page can be shown: every step's statistics and heat up to the last step (the
    room the arrays grew into beyond it, which depends on the blocks, is empty)."""
    r = feed.rollup
    n = r.last_step + 1
    out = {f"line:{f}:{k}": a[:n] for f, st in r.lines.items() for k, a in st.items()}
    for f, st in r.lines.items():
        assert all(np.isnan(a[n:]).all() if a.dtype.kind == "f" else not a[n:].any() for a in st.values())
    for f, g in r.heat.items():
        cols = (n - 1) // g.step_width + 1
        out[f"heat:{f}"] = np.concatenate([g.sums[:, :cols], g.counts[:, :cols]])
        out[f"widths:{f}"] = np.array([g.rank_width, g.step_width])
        assert not g.sums[:, cols:].any() and not g.counts[:, cols:].any()
    return out


@pytest.mark.parametrize("seed", range(4))
def test_a_fold_of_many_pushes_draws_what_one_push_at_a_time_draws(seed):
    pushes = results(rank_pushes(seed))
    alone, together = RunFeed(5.0, None), RunFeed(5.0, None)
    for p in pushes:
        alone.add_pushes([p])
    at, rng = 0, np.random.default_rng(seed)
    while at < len(pushes):
        n = int(rng.integers(1, 200))   # what gathered between two wake-ups
        together.add_pushes(pushes[at:at + n])
        at += n
    alone.flush_all()
    together.flush_all()
    a, b = rollup_arrays(alone), rollup_arrays(together)
    assert a.keys() == b.keys() and alone.rollup.steps_seen == together.rollup.steps_seen == 300
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), k


def test_the_held_columns_give_back_each_runs_pushes_as_their_concatenation(monkeypatch):
    # The writer thread copies a group commit's large pushes into the hub's held columns and
    # lets them go; the hub's thread reads a run's pushes back out of them. Whatever the runs'
    # interleaving, the group commits' sizes, the fields each push lacks, the columns growing
    # (1024 slots first) or what arrived during a fold moved to the front: a run's read is
    # MetricBatch.concat of its pushes, the drawn fields only, and the rollup folded from the
    # queue is the one folded from the pushes themselves. Small groups are queued as they are
    # (the threshold lowered here so that both kinds mix).
    monkeypatch.setattr(hub_module, "HOLD_FROM_RECORDS", 40)
    rng = np.random.default_rng(5)
    runs = {r: rank_pushes(10 + i, n_steps=60, n_ranks=int(rng.choice([4, 24, 300]))) for i, r in enumerate("abc")}
    for pushes in runs.values():   # some pushes lack a drawn field, or report an extra one
        for b in pushes[::7]:
            del b.values["loss"], b.present["loss"]
        for b in pushes[3::11]:
            b.values["other"], b.present["other"] = np.ones(len(b)), np.ones(len(b), bool)
    # The runs' pushes interleaved at random, each run's in their order.
    labels = rng.permutation([r for r, pushes in runs.items() for _ in pushes])
    nexts = {r: iter(pushes) for r, pushes in runs.items()}
    stream = [(str(r), next(nexts[str(r)])) for r in labels]
    seq = {r: 0 for r in runs}
    fed = {r: [] for r in runs}
    direct = {r: RunFeed(5.0, None) for r in runs}
    hub = RollupHub(store=None)   # committed() and the fold, without a thread or a store
    hub.feeds = {r: RunFeed(5.0, None) for r in runs}
    held_seen, compared, at = False, 0, 0
    def commit_next() -> None:   # the writer thread: a group commit's pushes
        nonlocal at
        group = stream[at:at + int(rng.integers(1, 9))]
        at += len(group)
        results = []
        for r, b in group:
            seq[r] += 1
            n_ranks = max(int(p.ranks.max()) for p in runs[r]) + 1
            results.append(IngestResult(r, len(b), False, 1, False, 1000 * ord(r) + seq[r], 1000.0 + at * 1e-3, b,
                                        RunView(1, 0, n_ranks, False)))
            fed[r].append(results[-1])
        hub.committed(results)

    while at < len(stream) or not hub._queue.empty():
        if at < len(stream):
            commit_next()
        if rng.random() < 0.3 or at >= len(stream):   # a fold of what gathered
            items = hub_module.coalesce.unpacked(hub_module.coalesce.take(hub._queue))
            if at < len(stream) and rng.random() < 0.5:
                commit_next()   # arriving during the fold: moved to the front by its release
            for item in hub_module.coalesce.group_pushes(items):
                queued = [p for p in item if isinstance(p, hub_module.Queued)]
                held_seen = held_seen or bool(queued)
                if queued and len(queued) == len(item):
                    want = MetricBatch.concat([runs_batch(fed, p) for p in item], only=hub_module.FIELDS)
                    got = hub.held.read([(p.start, p.stop) for p in item],
                                        list(dict.fromkeys(f for p in item for f in p.fields)))
                    assert list(got.values) == list(want.values)
                    for name in ("steps", "ranks"):
                        assert np.array_equal(getattr(got, name), getattr(want, name))
                    for f in want.values:
                        assert np.array_equal(got.values[f], want.values[f], equal_nan=True)
                        assert np.array_equal(got.present[f], want.present[f])
                    compared += 1
                hub._handle(item)
            upto = max((p.stop for p in items if isinstance(p, hub_module.Queued)), default=None)
            if upto is not None:
                hub.held.release(upto)
    assert held_seen and compared > 10 and len(hub.held.steps) > 1024   # both kinds, and the columns grew
    for r in runs:
        for p in fed[r]:
            direct[r].add_pushes([p])
        direct[r].flush_all()
        hub.feeds[r].flush_all()
        a, b = rollup_arrays(direct[r]), rollup_arrays(hub.feeds[r])
        assert a.keys() == b.keys() and direct[r].rollup.steps_seen == hub.feeds[r].rollup.steps_seen == 60
        for k in a:
            assert np.array_equal(a[k], b[k], equal_nan=True), (r, k)


def runs_batch(fed: dict, queued) -> MetricBatch:
    """The batch of the push a Queued stands for (found by its chunk id)."""
    return next(p.batch for p in fed[queued.run_id] if p.chunk_id == queued.chunk_id)


def test_the_hub_lets_a_large_push_go_before_it_folds_it():
    # What the hub queues of a large push is its records' copy, not the push: its columns (and
    # its encoded chunk) are freed as soon as the writer thread is done with it, not half a
    # second later when the hub's thread wakes (HeldColumns).
    n = hub_module.HOLD_FROM_RECORDS
    b = MetricBatch(np.zeros(n, np.int64), np.arange(n, dtype=np.int64), {"loss": np.ones(n), "comm_time": np.ones(n)},
                    {"loss": np.ones(n, bool), "comm_time": np.ones(n, bool)})
    watched = [weakref.ref(a) for a in (b.steps, b.ranks, b.values["loss"], b.present["loss"], b.values["comm_time"])]
    hub = RollupHub(store=None)
    hub.committed([IngestResult("r", n, False, 1, True, 1, 1000.0, b, RunView(1, 0, n, False), b"chunk")])
    del b
    gc.collect()
    assert all(w() is None for w in watched)
    (queued,) = hub._queue.get_nowait()
    assert queued.batch is None and queued.payload is None and queued.fields == ("loss",)
    assert np.array_equal(hub.held.read([(queued.start, queued.stop)], ["loss"]).ranks, np.arange(n))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_drain_does_not_wait_out_the_fold_interval_and_the_first_snapshot_waits_its_turn(tmp_path):
    store = open_store(str(tmp_path / "fold.db"), snapshot_every_s=3600.0)
    store.open()
    clock = Clock()
    # An interval no drain could wait out within its timeout.
    hub = RollupHub(store, clock=clock, tick_interval_s=3600.0, snapshot_every_s=30.0, fold_every_s=3600.0)
    store.subscribe(hub.committed)
    hub.start()
    try:
        pushes = rank_pushes(7, n_steps=40, n_ranks=8)
        for k, b in enumerate(pushes):
            store.ingest.submit_metrics("r", b, f"d{k}").result(10)
        assert hub.drain(10)
        hub.flush("r")
        assert hub.drain(10)
        assert hub.read("r", lambda r: r.steps_seen) == 40

        def snapshot_after_tick():
            hub.tick()
            assert hub.drain(10)
            store.barrier().result(10)   # the snapshot's write, if one was asked
            return store.snapshot("r", "dashboard")

        assert snapshot_after_tick() is None   # the run's first tick: no snapshot yet ...
        clock.now += 29.0
        assert snapshot_after_tick() is None
        clock.now += 1.0   # ... until snapshot_every_s after it
        assert snapshot_after_tick() is not None
        want = rollup_arrays(hub.feeds["r"])
    finally:
        hub.stop()
    # A run with no snapshot is rebuilt from its chunks, to the same rollup.
    rebuilt = RollupHub(store, clock=clock)._restored(store.reads.get_run_row("r"), None)
    rebuilt.flush_all()
    got = rollup_arrays(rebuilt)
    assert got.keys() == want.keys()
    for k in want:
        assert np.array_equal(got[k], want[k], equal_nan=True), k
    store.close()
