"""The dashboard's thread folds what gathered between its wake-ups (``RollupHub.fold_every_s``)
and snapshots a run every ``snapshot_every_s``, the first time too: a fold of many pushes draws
the rollup that one push at a time draws, a drain does not wait out the interval, and a run not
snapshotted yet is rebuilt from its chunks on restart."""
from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import pytest

from healthsvc.dashboard.hub import RollupHub, RunFeed
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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextmanager
def hub_on_store(path: str, clock: Clock):
    """A started hub fed by a fresh SQLite store at ``path`` (no ingest snapshots), folding only
    when asked (or at FOLD_AT_RECORDS): stopped, and the store closed, on the way out."""
    store = open_store(path, snapshot_every_s=3600.0)
    store.open()
    hub = RollupHub(store, clock=clock, tick_interval_s=3600.0, fold_every_s=3600.0)
    store.subscribe(hub.committed)
    hub.start()
    try:
        yield store, hub
    finally:
        hub.stop()
        store.close()


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


def test_the_fold_does_not_wait_out_its_interval_once_fold_at_records_are_queued(tmp_path):
    # What waits for a fold is whole pushes: a busy service must not hold an interval's worth of
    # them (tens of MB at 1,024-record pushes), so FOLD_AT_RECORDS queued records end the wait.
    from healthsvc.dashboard.hub import FOLD_AT_RECORDS
    with hub_on_store(str(tmp_path / "bound.db"), Clock()) as (store, hub):
        n_ranks, rng = 1024, np.random.default_rng(0)
        n_steps = -(-FOLD_AT_RECORDS // n_ranks)
        for s in range(n_steps):
            b = MetricBatch(np.full(n_ranks, s), np.arange(n_ranks, dtype=np.int64))
            b.values["step_time"], b.present["step_time"] = 1.0 + 0.1 * rng.random(n_ranks), np.ones(n_ranks, bool)
            store.ingest.submit_metrics("r", b, f"d{s}").result(10)
        deadline = time.monotonic() + 20.0   # no drain: only the bound can end the hour's wait
        while (hub.read("r", lambda r: r.steps_seen) or 0) < n_steps and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hub.read("r", lambda r: r.steps_seen) == n_steps


def test_a_heat_grid_holds_rows_for_the_ranks_it_has_and_the_page_shows_every_rank(tmp_path):
    # A run's heat grid has as many rows as its ranks need (a power of two), not MAX_RANK_BINS:
    # 6 ranks reporting compute_time hold 8 rows. Ranks that join later without the field add no
    # rows, and the page still draws a row for every rank (empty where none reported), as it
    # did when every grid held MAX_RANK_BINS rows; a rank that reports it later adds rows.
    from healthsvc.dashboard.views import heatmap

    def push(step: int, n_ranks: int, fields: tuple[str, ...]) -> None:
        b = MetricBatch(np.full(n_ranks, step), np.arange(n_ranks, dtype=np.int64))
        for f in fields:
            b.values[f], b.present[f] = np.where(np.arange(n_ranks) == 2, 2.0, 1.0), np.ones(n_ranks, bool)
        store.ingest.submit_metrics("r", b, f"d{step}").result(10)
        assert hub.drain(10)
        hub.flush("r")
        assert hub.drain(10)

    with hub_on_store(str(tmp_path / "rows.db"), Clock()) as (store, hub):
        push(0, 6, ("loss", "compute_time"))
        assert hub.read("r", lambda r: r.heat["compute_time"].sums.shape[0]) == 8
        push(1, 40, ("loss",))
        assert hub.read("r", lambda r: r.heat["compute_time"].sums.shape[0]) == 8
        page = heatmap(hub, "r", "compute_time", None, None, 100)
        assert page["n_rows"] == 40 and page["hottest"]["row"] == 2
        shown = np.asarray(page["values"], np.float64)
        assert np.isfinite(shown[:6, 0]).all() and np.isnan(shown[6:]).all()
        push(2, 40, ("compute_time",))
        assert hub.read("r", lambda r: r.heat["compute_time"].sums.shape[0]) == 64
        shown = np.asarray(heatmap(hub, "r", "compute_time", None, None, 100)["values"], np.float64)
        assert shown.shape[0] == 40 and np.isfinite(shown[:, 2]).all()
