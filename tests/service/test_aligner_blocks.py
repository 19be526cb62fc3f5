"""``batch_to_block``, the scatter of (step, rank) records into a steps x ranks block that both the
monitor and the dashboard run on every aligned block: whatever the records' order, repeats and
gaps, a cell holds the last reported value of its (step, rank), NaN and not present where none."""
from __future__ import annotations

import numpy as np
import pytest

from healthsvc.monitor.aligner import batch_to_block


def expected(steps, ranks, values, present):
    """The block record by record, in Python: later records win."""
    u_steps, u_ranks = sorted(set(steps.tolist())), sorted(set(ranks.tolist()))
    out = {}
    for f, v in values.items():
        cells = {}
        for s, r, x, p in zip(steps.tolist(), ranks.tolist(), v.tolist(), present[f].tolist()):
            if p:
                cells[(s, r)] = x
        mat = np.array([[cells.get((s, r), np.nan) for r in u_ranks] for s in u_steps])
        pres = np.array([[(s, r) in cells for r in u_ranks] for s in u_steps])
        out[f] = (mat, pres)
    return np.array(u_steps), np.array(u_ranks), out


@pytest.mark.parametrize("layout", ["in order", "shuffled", "repeats and gaps", "one step", "a rank missing once",
                                    "a step repeated", "steps of other ranks"])
def test_a_block_holds_each_cells_last_reported_value(layout):
    rng = np.random.default_rng(len(layout))
    for _ in range(100):
        n_steps, n_ranks = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        if layout == "one step":
            n_steps = 1
        steps = np.repeat(np.arange(n_steps) * int(rng.integers(1, 4)) + int(rng.integers(0, 10**6)), n_ranks)
        ranks = np.tile(np.arange(n_ranks) * int(rng.integers(1, 3)), n_steps)
        if layout == "shuffled":
            order = rng.permutation(len(steps))
            steps, ranks = steps[order], ranks[order]
        elif layout == "a rank missing once" and len(steps) > 1:   # then not whole steps
            drop = int(rng.integers(0, len(steps)))
            steps, ranks = np.delete(steps, drop), np.delete(ranks, drop)
        elif layout == "a step repeated":                           # whole steps, but not increasing
            steps, ranks = np.concatenate([steps, steps[:n_ranks]]), np.concatenate([ranks, ranks[:n_ranks]])
        elif layout == "steps of other ranks" and n_steps > 1:      # as many records, other ids
            ranks = ranks.copy()
            ranks[-1] += 1000
        elif layout == "repeats and gaps":
            pick = rng.integers(0, len(steps), len(steps))
            steps, ranks = steps[pick], ranks[pick]
        values = {"loss": rng.standard_normal(len(steps)), "step_time": rng.standard_normal(len(steps))}
        present = {"loss": rng.random(len(steps)) > 0.2, "step_time": np.ones(len(steps), bool)}
        block = batch_to_block(steps.astype(np.int64), ranks.astype(np.int64), values, present)
        want_steps, want_ranks, want = expected(steps, ranks, values, present)
        assert block.steps.tolist() == want_steps.tolist() and block.ranks.tolist() == want_ranks.tolist()
        for f, (mat, pres) in want.items():
            assert np.array_equal(block.values[f], mat, equal_nan=True)
            assert np.array_equal(block.present[f], pres)


def test_the_aligner_emits_each_steps_last_reported_values_whatever_the_pushes():
    """The step aligner over random pushes (whole steps in order, single records, shuffled
    records, steps missing ranks, fields coming and going, late records): every block it emits
    holds, for its steps, the last value each rank reported before the step went out; a record
    for a step already emitted is late and counted."""
    from healthsvc.monitor.aligner import StepAligner, _step_counts
    from healthsvc.store.batch import MetricBatch
    rng = np.random.default_rng(7)
    for a in (rng.integers(0, 9, 70), np.sort(rng.integers(0, 9, 70)), np.arange(70), np.zeros(70, np.int64)):
        u, c = _step_counts(a.astype(np.int64))
        want_u, want_c = np.unique(a, return_counts=True)
        assert u.tolist() == want_u.tolist() and c.tolist() == want_c.tolist()
    for trial in range(30):
        world = int(rng.integers(1, 80))
        aligner, now, step, emitted, late = StepAligner(timeout_s=5.0, min_block_steps=4), 0.0, 0, -1, 0
        accepted: list[tuple[int, int, str, float, bool]] = []
        records: dict[int, int] = {}          # accepted records per step, and when it was first seen
        first_seen: dict[int, float] = {}
        for _ in range(40):
            now += float(rng.uniform(0, 1.5))
            kind = rng.random()
            n_steps = int(rng.integers(1, 4))
            steps = np.repeat(np.arange(step, step + n_steps), world)
            ranks = np.tile(np.arange(world), n_steps)
            if kind < 0.2:                       # records shuffled, some ranks missing
                keep = rng.random(len(steps)) > 0.2
                order = rng.permutation(int(keep.sum()))
                steps, ranks = steps[keep][order], ranks[keep][order]
            elif kind < 0.3:                     # late: steps already behind
                steps = np.maximum(steps - 5, 0)
            step += n_steps
            if not len(steps):
                continue
            fields = ["loss", "step_time"] if rng.random() > 0.2 else ["loss"]
            batch = MetricBatch(steps.astype(np.int64), ranks.astype(np.int64),
                                {f: rng.standard_normal(len(steps)) for f in fields},
                                {f: rng.random(len(steps)) > 0.1 for f in fields})
            for i, (s, r) in enumerate(zip(steps.tolist(), ranks.tolist())):
                if s <= emitted:
                    late += 1
                    continue
                records[s] = records.get(s, 0) + 1
                first_seen.setdefault(s, now)
                for f in fields:
                    accepted.append((s, r, f, float(batch.values[f][i]), bool(batch.present[f][i])))
            for block in aligner.add(batch, now, world):
                want: dict[tuple[int, int, str], float] = {}
                for s, r, f, x, p in accepted:
                    if s in set(block.steps.tolist()) and p:
                        want[(s, r, f)] = x
                assert block.steps.min() > emitted
                for s in block.steps.tolist():   # each step complete, or it waited its time out
                    assert records[s] >= world or now - first_seen[s] >= 5.0, (trial, s)
                emitted = int(block.steps.max())
                for f in block.values:
                    for i, s in enumerate(block.steps.tolist()):
                        for j, r in enumerate(block.ranks.tolist()):
                            got = block.values[f][i, j] if block.present[f][i, j] else None
                            assert got == want.get((s, r, f)), (trial, f, s, r)
                assert {k for k in want} <= {(s, r, f) for f in block.values for s in block.steps.tolist()
                                             for r in block.ranks.tolist()}
            assert aligner.late_records == late
