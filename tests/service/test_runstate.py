"""The ingest's per-run state: attempts from steps that go back, hosts by rank, snapshots."""
from __future__ import annotations

import json

import numpy as np

from healthsvc.store.batch import MetricBatch
from healthsvc.store.runstate import RunState


def batch(steps, ranks, hosts=None):
    b = MetricBatch(steps=np.asarray(steps), ranks=np.asarray(ranks))
    if hosts is not None:
        b.host_names = sorted({h for h in hosts if h is not None})
        b.host_index = np.array([-1 if h is None else b.host_names.index(h) for h in hosts], dtype=np.int32)
    return b


def test_attempts_open_when_a_rank_repeats_a_step():
    st = RunState("r")
    first = batch([0, 0, 1, 1], [0, 1, 0, 1])
    assert st.needs_new_attempt(first)          # the first data opens attempt 1
    st.open_attempt(0)
    st.advance(first)
    assert not st.needs_new_attempt(batch([2], [0]))
    assert not st.needs_new_attempt(batch([0], [5]))   # a new rank is not a restart
    assert st.needs_new_attempt(batch([1], [1]))       # rank 1 already reported step 1


def test_host_updates_are_read_only_and_the_last_report_wins():
    st = RunState("r")
    b = batch([0, 0, 1], [0, 1, 0], hosts=["a", "b", "c"])
    updates = st.host_updates(b)
    assert updates == [(0, "c"), (1, "b")] and st.host_of(0) is None
    st.set_hosts(updates)
    assert (st.host_of(0), st.host_of(1)) == ("c", "b")
    assert st.host_updates(batch([2, 2], [0, 1], hosts=["c", None])) == []   # nothing new
    assert st.host_updates(batch([3], [1], hosts=["a"])) == [(1, "a")]


def test_snapshot_round_trip():
    st = RunState("r")
    st.open_attempt(10)
    b = batch([10, 11], [3, 3], hosts=["n1", "n1"])
    st.advance(b)
    st.set_hosts(st.host_updates(b))
    st.finished_ranks.add(3)
    back = RunState.from_dict("r", json.loads(json.dumps(st.to_dict())))
    assert back.attempt == 1 and back.start_step == 10 and back.max_step() == 11
    assert back.host_of(3) == "n1" and back.finished_ranks == {3}
    assert back.needs_new_attempt(batch([11], [3])) and not back.needs_new_attempt(batch([12], [3]))


def test_idempotency_keys_are_forgotten_after_the_dedupe_window(tmp_path):
    from healthsvc.store.sqlite import SQLiteStore
    now = [1000.0]
    store = SQLiteStore(str(tmp_path / "d.db"), dedupe_window_s=100.0, clock=lambda: now[0])
    store.open()
    try:
        def push(step, digest):
            return store.ingest.submit_metrics("r", batch([step], [0]), digest).result(10)

        assert not push(0, "a").duplicate
        now[0] += 50
        assert push(0, "a").duplicate                      # a retry within the window
        now[0] += 60
        assert not push(1, "b").duplicate                  # this push prunes keys older than 100 s
        count = store.read_conn().execute("SELECT count(*) FROM batches").fetchone()[0]
        assert count == 1                                  # "a" (t=1000) is gone, "b" stays
    finally:
        store.close()


def test_memory_follows_the_ranks_seen_not_the_largest_rank_id():
    st = RunState("r")
    st.open_attempt(0)
    b = batch([0, 0], [3, 50_000_000], hosts=["a", "b"])
    st.advance(b)
    st.set_hosts(st.host_updates(b))
    assert len(st.last_step) == 2 and len(st.host_code) == 2       # two ranks, two entries
    assert st.ranks_seen().tolist() == [3, 50_000_000] and st.host_of(50_000_000) == "b"
    assert st.host_of(4) is None and st.needs_new_attempt(batch([0], [50_000_000]))
    back = RunState.from_dict("r", json.loads(json.dumps(st.to_dict())))
    assert back.ranks_seen().tolist() == [3, 50_000_000] and len(back.last_step) == 2


def test_the_view_is_what_the_monitor_reads_and_hosts_travel_aligned_with_ranks():
    st = RunState("r")
    st.open_attempt(0)
    b = batch([0, 0, 0], [0, 7, 3], hosts=["a", None, "b"])
    st.advance(b)
    st.set_hosts(st.host_updates(b))
    assert st.view() == (view := st.view()) and (view.attempt, view.ranks_seen, view.finished) == (1, 3, False)
    assert st.hosts_of((3, 7, 0, 99)) == ("b", None, "a", None)
    st.open_attempt(5)                          # a new attempt: nobody has reported in it yet
    assert st.view().ranks_seen == 0


def with_incarnation(b: MetricBatch, name: str) -> MetricBatch:
    b.labels["incarnation"] = ([name], np.zeros(len(b), dtype=np.int32))
    return b


def test_incarnations_tell_restarts_and_survive_a_snapshot():
    st = RunState("r")
    st.open_attempt(0)
    st.advance(with_incarnation(batch([0, 1, 2], [0, 0, 0]), "p1"))
    st.advance(batch([0, 1], [1, 1]))                        # rank 1 sends no incarnation
    back = RunState.from_dict("r", json.loads(json.dumps(st.to_dict())))
    for state in (st, back):
        assert not state.needs_new_attempt(with_incarnation(batch([1], [0]), "p1"))   # late, same process
        assert state.late(with_incarnation(batch([1], [0]), "p1"))
        assert state.needs_new_attempt(with_incarnation(batch([3], [0]), "p2"))       # restarted, steps go on
        assert not state.needs_new_attempt(with_incarnation(batch([1], [0]), "p0"), frozenset({"p0"}))
        assert state.needs_new_attempt(batch([1], [1]))                               # by steps
        assert not state.needs_new_attempt(with_incarnation(batch([5], [2]), "q1"))   # a new rank
        assert state.progress_at(with_incarnation(batch([3], [0]), "p2")) is None
        assert state.progress_at(with_incarnation(batch([3], [0]), "p1")) is not None
    # A new attempt forgets the old one's incarnations: its first record of rank 0 joins.
    back.open_attempt(3)
    assert list(back.incarnation_misses(with_incarnation(batch([3], [0]), "p1"))) == [0]
    assert back.new_incarnations(with_incarnation(batch([3, 3], [0, 1]), "p2")) == [(0, "p2"), (1, "p2")]


def two_opened_states() -> tuple[RunState, RunState]:
    """Two states of one run, each in its first attempt: one per way compared."""
    pair = RunState("r"), RunState("r")
    for st in pair:
        st.open_attempt(0)
    return pair


def test_a_rank_s_own_push_is_judged_and_applied_as_the_general_way_does():
    # Property: one-record pushes (the usual push, taken in Python scalars) against the array
    # code every other batch takes, over random runs: ranks new and known, steps ahead, repeated
    # and behind, incarnations the same, new, absent, and a restart now and then.
    rng = np.random.default_rng(11)
    for trial in range(30):
        fast, general = two_opened_states()
        for _ in range(200):
            rank, step = int(rng.integers(0, 12)), int(rng.integers(0, 30))
            b = batch([step], [rank])
            which = rng.integers(0, 4)
            if which:   # an incarnation: the rank's usual one, another, or a name with no record
                name = f"p{rank}" if which == 1 else f"q{rank}-{int(rng.integers(0, 3))}"
                b.labels["incarnation"] = ([name], np.array([-1 if which == 3 else 0], np.int32))
            assert (fast.progress_at(b) is None) == (general._progress_of_records(b) is None), (trial, rank, step, which)
            fast.advance(b)
            general._advance_records(b)
            assert fast.to_dict() == general.to_dict()
            if rng.random() < 0.02:
                for st in (fast, general):
                    st.open_attempt(step)


def test_advancing_at_the_positions_progress_found_is_advancing_by_a_fresh_lookup():
    # Property: the store's usual push asks progress_at once and hands its positions to advance;
    # that must leave the state as an advance that looks the ranks up again does, for batches of
    # one and of several records (one step or several, ranks dense or not, new, repeated, behind).
    rng = np.random.default_rng(5)
    for trial in range(40):
        handed, looked_up = two_opened_states()
        for _ in range(150):
            n = int(rng.integers(1, 6))
            ranks = rng.integers(0, 10 if trial % 2 else 40, n)
            base = int(rng.integers(0, 25))
            steps = np.full(n, base) if rng.random() < 0.5 else base + rng.integers(0, 3, n)
            b = batch(steps, ranks)
            at = handed.progress_at(b)
            assert (at is None) == (looked_up.progress_at(b) is None), (trial, steps, ranks)
            handed.advance(b, at)
            looked_up.advance(b)
            assert handed.to_dict() == looked_up.to_dict(), (trial, steps, ranks)


def test_rank_positions_are_those_of_a_binary_search_whether_the_ranks_are_dense_or_not():
    # A job's ranks 0..n-1 take the dense way (a rank is its own position); gaps, ranks beyond
    # the known ones and a state that grows from dense to sparse must give what searchsorted gives.
    rng = np.random.default_rng(7)
    for trial in range(200):
        st = RunState("r")
        st.open_attempt(0)
        n = int(rng.integers(1, 40))
        known = np.arange(n) if trial % 2 else np.sort(rng.choice(80, n, replace=False))
        st.advance(batch(np.zeros(len(known), int), known))
        asked = rng.integers(0, 90, int(rng.integers(2, 30)))
        pos, hit = st._positions(asked)
        want = np.searchsorted(st.ids, asked)
        assert (pos == want).all() and (hit == np.isin(asked, st.ids)).all(), (known, asked)
        grown = np.unique(asked)
        st.advance(batch(np.ones(len(grown), int), grown))   # ids grow: dense or not any more
        assert (st._positions(st.ids)[0] == np.arange(len(st.ids))).all()


def test_a_reader_names_hosts_while_the_writer_adds_ranks_never_wrongly():
    # The run's owner names the hosts of its findings on its own thread while the writer goes on
    # adding ranks, each join swapping the per-rank arrays one after the other. Ranks join from
    # the top down, so every join moves the known ranks' positions: a read that paired the new
    # ranks with the old hosts would name another rank's host. Each answer must be the rank's
    # host or None (not known yet). The interpreter switches threads as often as it can here.
    import sys
    import threading
    st = RunState("r")
    st.open_attempt(0)
    done = threading.Event()
    wrong: list = []
    ranks = tuple(range(0, 1200, 7))

    def read() -> None:
        while not done.is_set():
            for r, h in zip(ranks, st.hosts_for_reader(ranks)):
                if h is not None and h != f"h{r}":
                    wrong.append((r, h))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for first in range(1170, -1, -30):   # 30 ranks join at a time, below all the known ones
            joining = list(range(first, first + 30))
            b = batch([0] * 30, joining, hosts=[f"h{r}" for r in joining])
            st.advance(b)
            st.set_hosts(st.host_updates(b))
    finally:
        done.set()
        reader.join(10)
        sys.setswitchinterval(interval)
    assert wrong == []
    assert st.hosts_for_reader((0, 1199, 1200)) == ("h0", "h1199", None)
