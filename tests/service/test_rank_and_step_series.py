"""Properties of the per-run parts behind /metrics: the steps counter (read from a real store's
attempts) never goes down and counts each attempt's steps, and the per-rank top-k is at most k, the
named ranks first, the rest the slowest, whatever the order and split of the pushes."""
from __future__ import annotations

import numpy as np

from healthsvc.run_metrics import RankTimes, steps_trained
from healthsvc.run_metrics.feed import new_batches
from healthsvc.store.batch import MetricBatch
from healthsvc.store.results import IngestResult


def feed(part, results: list[IngestResult]) -> None:
    """``results`` to ``part`` as the pipeline hands a group commit's (``RunSeries.committed``)."""
    part.add(list(new_batches(results)))


def result(run: str, steps, ranks, attempt: int, new_attempt: bool = False, duplicate: bool = False,
           **fields) -> IngestResult:
    steps, ranks = np.asarray(steps, np.int64), np.asarray(ranks, np.int64)
    values = {f: np.asarray(v, float) for f, v in fields.items()}
    present = {f: np.ones(len(steps), bool) for f in fields}
    return IngestResult(run, len(steps), duplicate, attempt, new_attempt, None, 0.0,
                        MetricBatch(steps, ranks, values, present))


def random_timings(r: IngestResult, rng: np.random.Generator, host: str, *, reported: float, spoiled: float,
                   named: float) -> None:
    """Give ``r``'s batch each timing field with probability ``reported``, one value NaN and one
    missing each with probability ``spoiled``, and with probability ``named`` hosts (``h0``,
    ``h1``, ``host``; some records none)."""
    n = len(r.batch.steps)
    for f in ("compute_time", "step_time"):
        if rng.random() < reported:
            v = rng.uniform(0.5, 2.0, n)
            p = np.ones(n, bool)
            if rng.random() < spoiled:
                v[rng.integers(0, n)] = np.nan
            if rng.random() < spoiled:
                p[rng.integers(0, n)] = False
            r.batch.values[f], r.batch.present[f] = v, p
    if rng.random() < named:
        r.batch.host_names = ["h0", "h1", host]
        r.batch.host_index = rng.integers(-1 if rng.random() < 0.3 else 0, 3, n).astype(np.int32)


def exported_steps(text: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families
    return next((s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                 if s.name == "healthsvc_run_steps_total" and s.labels.get("run") == "r"), None)


def test_the_steps_counter_counts_each_attempts_steps_and_never_goes_down(tmp_path):
    """Pushes to the service (restarts and rollbacks to an earlier step, re-sent batches among
    them): the exported count, read from the store's attempts, is each attempt's steps, and
    never goes down."""
    from tests.harness import InProcessService

    rng = np.random.default_rng(3)
    expected, last, step, attempts = 0, 0, 0, 0
    with InProcessService(tmp_path) as svc:
        def push(steps, rank=0, batch_id=None):
            body = {"columns": {"step": list(steps), "rank": [rank] * len(steps), "loss": [1.0] * len(steps)}}
            if batch_id:
                body["batch_id"] = batch_id
            assert svc.http.post("/v1/runs/r/metrics", json=body).status_code == 202

        for i in range(120):
            if attempts == 0 or rng.random() < 0.05:       # a restart or rollback to an earlier step
                step = int(rng.integers(0, step + 1)) if attempts else 0
                n = int(rng.integers(1, 20))
                push(range(step, step + n), batch_id=f"b{i}")
                attempts += 1
                expected, step = expected + n, step + n
            elif rng.random() < 0.1:                          # re-sent: nothing new
                push(range(step - 1, step), batch_id=f"b{i - 1}")
            else:
                n = int(rng.integers(1, 20))
                push(range(step, step + n), batch_id=f"b{i}")
                expected, step = expected + n, step + n
            svc.drain()
            run = svc.http.get("/v1/runs/r").json()
            total = exported_steps(svc.http.get("/metrics").text)
            assert run["attempt"] == attempts and total == expected and total >= last, (i, run)
            assert steps_trained(svc.http.get("/v1/runs/r", params={"detail": True}).json()["attempts"]) == total
            last = total


def test_the_top_ranks_are_named_first_then_the_slowest_whatever_the_push_order():
    rng = np.random.default_rng(11)
    world, k = 1000, 5
    times = rng.uniform(0.9, 1.1, world)
    times[[17, 400, 999, 3]] = [4.0, 3.0, 2.0, 1.5]
    steps = np.repeat(np.arange(4), world)
    ranks = np.tile(np.arange(world), 4)
    value = np.tile(times, 4)
    value[:world] = 9.0            # step 0: an old value every rank overwrote since
    for split in (1, 3, 17):
        perm = rng.permutation(len(steps))
        rt = RankTimes()
        for part in np.array_split(perm, split):
            feed(rt, [result("r", steps[part], ranks[part], 1, compute_time=value[part])])
        top = rt.top("r", k, named=[(250, "h1"), (250, "h1"), (17, None)])
        assert [line.rank for line in top] == [250, 17, 400, 999, 3]
        assert [line.findings for line in top] == [2, 1, 0, 0, 0]
        assert top[0].host == "h1" and top[2].field == "compute_time"
        median = float(np.median(times))
        assert abs(top[2].ratio - 3.0 / median) < 1e-12 and top[2].value == 3.0
        assert len(rt.top("r", 0)) == 0 and len(rt.top("r", 2, named=[(r, None) for r in range(9)])) == 2


def test_step_time_is_ranked_when_no_compute_time_is_reported():
    rt = RankTimes()
    feed(rt, [result("r", [0, 0, 0], [0, 1, 2], 1, step_time=[1.0, 1.0, 2.0])])
    top = rt.top("r", 1)
    assert [(line.rank, line.field, line.ratio) for line in top] == [(2, "step_time", 2.0)]
    assert rt.top("unknown", 3) == []


def test_after_a_rollback_the_new_attempts_timings_replace_the_old_and_a_late_spool_does_not():
    rt = RankTimes()
    feed(rt, [result("r", [90, 90], [0, 1], 1, compute_time=[5.0, 1.0])])   # rank 0 slow
    feed(rt, [result("r", [40, 40], [0, 1], 2, compute_time=[1.0, 3.0])])   # rolled back
    feed(rt, [result("r", [95], [0], 1, compute_time=[7.0])])               # spooled late
    assert [(line.rank, line.value) for line in rt.top("r", 1)] == [(1, 3.0)]


def test_a_ranks_newest_reported_value_stands_when_a_later_record_lacks_or_botches_it():
    """Pending pushes are folded together: per field, the newest *reported finite* value of a rank
    counts, whether the records came in one push or several."""
    for split in (False, True):
        rt = RankTimes()
        steps, ranks, value = [5, 6, 7, 5, 6, 7], [0, 0, 0, 1, 1, 1], [2.0, 3.0, np.nan, 1.0, 1.0, 1.0]
        present = np.array([True, True, True, True, True, False])
        parts = [slice(0, 3), slice(3, 6)] if split else [slice(0, 6)]
        for part in parts:
            r = result("r", steps[part], ranks[part], 1, compute_time=value[part])
            r.batch.present["compute_time"] = present[part]
            feed(rt, [r])
        assert [(line.rank, line.value) for line in rt.top("r", 2)] == [(0, 3.0), (1, 1.0)]


def test_pending_pushes_pruned_to_the_newest_or_folded_as_they_come_leave_the_table_as_folding_every_push_does():
    """Past ``FOLD_AT_RECORDS`` pending records, a run's pending pushes are pruned to the newest
    when it supersedes them, else folded (``RankTimes._prune_or_fold``): the table after any
    sequence of pushes (whole steps, several steps, late spools, restarts, NaN and missing
    values, hosts, ranks in another order) is the one folding every push gives, and both ran."""
    from healthsvc.run_metrics.ranks import FOLD_AT_RECORDS, _RankTable
    rng = np.random.default_rng(5)
    world = FOLD_AT_RECORDS // 4 + 44   # a threshold crossed every few pushes
    replaced = folded = 0
    for trial in range(80):
        rt, every = RankTimes(), []
        attempt, step = 1, 0
        for _ in range(int(rng.integers(2, 12))):
            roll = rng.random()
            if roll < 0.1:
                attempt, step = attempt + 1, int(rng.integers(0, step + 1))    # a restart
            n_steps = int(rng.integers(1, 3))
            at_step = step if rng.random() > 0.25 else max(0, step - 3)       # sometimes late
            steps = np.repeat(np.arange(at_step, at_step + n_steps), world)
            roll = rng.random()   # the job's ranks; in another order; another set of as many
            ranks = np.tile(np.arange(world) if roll > 0.2 else rng.permutation(world) if roll > 0.1
                            else np.arange(world) + 7, n_steps)
            r = result("r", steps, ranks, attempt if rng.random() > 0.1 else max(1, attempt - 1))
            random_timings(r, rng, f"h{trial}", reported=0.8, spoiled=0.2, named=0.3)
            step = max(step, at_step + n_steps)
            before = len(rt._pending.get("r", []))
            feed(rt, [r])
            after = len(rt._pending.get("r", []))
            replaced += before >= 1 and after == 1
            folded += after == 0
            every.append((r.attempt, r.batch))
        reference = _RankTable()
        reference.fold(every)
        table = rt._fold("r")
        assert table.ids.tolist() == reference.ids.tolist()
        for f in reference.values:
            np.testing.assert_array_equal(table.values[f], reference.values[f])
            np.testing.assert_array_equal(table.at[f], reference.at[f])
        assert set(table.values) == set(reference.values)
        assert [table.host(int(r)) for r in table.ids] == [reference.host(int(r)) for r in reference.ids]
    assert replaced > 10 and folded > 10, (replaced, folded)   # both ways ran (17 and 151)


def test_many_small_pushes_are_folded_as_they_come_into_the_table_one_fold_of_all_gives():
    """Pushes of a record or a few are folded every ``FOLD_AT_PUSHES`` (few objects held for the
    garbage collector to walk): the rank table is the one folding every push at once gives, and
    the step-time median is that of the newest ``STEP_TIME_WINDOW`` finite values."""
    from healthsvc.run_metrics.ranks import FOLD_AT_PUSHES, _RankTable
    from healthsvc.run_metrics.step_times import STEP_TIME_WINDOW, StepTimes
    rng = np.random.default_rng(9)
    for trial in range(6):
        rt, st, every, times = RankTimes(), StepTimes(), [], []
        attempt, step = 1, 0
        for _ in range(int(rng.integers(3, 6)) * FOLD_AT_PUSHES):
            if rng.random() < 0.002:
                attempt, step = attempt + 1, int(rng.integers(0, step + 1))    # a restart
            n = int(rng.integers(1, 4))
            at_step = step if rng.random() > 0.1 else max(0, step - 3)         # sometimes late
            r = result("r", np.full(n, at_step), rng.choice(40, n, replace=False),
                       attempt if rng.random() > 0.05 else max(1, attempt - 1))
            for f in ("compute_time", "step_time"):
                if rng.random() < 0.9:
                    v = rng.uniform(0.5, 2.0, n)
                    v[rng.random(n) < 0.1] = np.nan
                    r.batch.values[f], r.batch.present[f] = v, rng.random(n) > 0.1
            if rng.random() < 0.2:
                r.batch.host_names = ["h0", f"h{trial}"]
                r.batch.host_index = rng.integers(-1, 2, n).astype(np.int32)
            step += int(rng.random() < 0.5)
            feed(rt, [r])
            feed(st, [r])
            assert len(rt._pending.get("r", [])) <= FOLD_AT_PUSHES
            every.append((r.attempt, r.batch))
            if "step_time" in r.batch.values:
                v = r.batch.values["step_time"][r.batch.present["step_time"]]
                times += v[np.isfinite(v)].tolist()
        reference = _RankTable()
        reference.fold(every)
        table = rt._fold("r")
        assert table.ids.tolist() == reference.ids.tolist() and set(table.values) == set(reference.values)
        for f in reference.values:
            np.testing.assert_array_equal(table.values[f], reference.values[f])
            np.testing.assert_array_equal(table.at[f], reference.at[f])
        assert [table.host(int(r)) for r in table.ids] == [reference.host(int(r)) for r in reference.ids]
        assert st.median("r") == float(np.median(times[-STEP_TIME_WINDOW:]))


def test_a_fold_of_the_newest_push_alone_when_it_covers_the_others_leaves_the_table_as_folding_every_push():
    """Pushes short of ``FOLD_AT_RECORDS`` are all held until the fold; the fold takes the
    newest alone when it covers the others (``ranks._newest_alone_if_it_supersedes``). Whatever
    the pushes (whole steps of the job's ranks, some in another order, a few ranks only, a rank
    beyond the job's, late spools, restarts, NaN and missing values, hosts), the table is the one
    folding every push gives, and both ways of folding ran."""
    from healthsvc.run_metrics.ranks import FOLD_AT_RECORDS, _RankTable, _newest_alone_if_it_supersedes
    rng = np.random.default_rng(11)
    world = 64
    assert 10 * (world + 1) < FOLD_AT_RECORDS   # every push is held until the fold (at most 10)
    alone = whole = 0
    for trial in range(120):
        rt, every = RankTimes(), []
        attempt, step = 1, 0
        for _ in range(int(rng.integers(2, 10))):
            if rng.random() < 0.05:
                attempt, step = attempt + 1, int(rng.integers(0, step + 1))    # a restart
            at_step = step if rng.random() > 0.1 else max(0, step - 2)        # sometimes late
            roll = rng.random()
            ranks = (np.arange(world) if roll > 0.2 else rng.permutation(world) if roll > 0.1
                     else rng.choice(world, 8, replace=False) if roll > 0.05 else np.r_[np.arange(world), world + 3])
            r = result("r", np.full(len(ranks), at_step), ranks,
                       attempt if rng.random() > 0.05 else max(1, attempt - 1))
            random_timings(r, rng, f"h{trial}", reported=0.9, spoiled=0.1, named=0.2)
            step += 1
            feed(rt, [r])
            every.append((r.attempt, r.batch))
        taken = _newest_alone_if_it_supersedes(list(rt._pending["r"]))
        alone += len(taken) == 1
        whole += len(taken) == len(every)
        reference = _RankTable()
        reference.fold(every)
        table = rt._fold("r")
        assert table.ids.tolist() == reference.ids.tolist()
        assert set(table.values) == set(reference.values)
        for f in reference.values:
            np.testing.assert_array_equal(table.values[f], reference.values[f])
            np.testing.assert_array_equal(table.at[f], reference.at[f])
        assert [table.host(int(r)) for r in table.ids] == [reference.host(int(r)) for r in reference.ids]
    assert alone > 20 and whole > 20, (alone, whole)   # both ways ran
