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


@pytest.mark.parametrize("layout", ["in order", "shuffled", "repeats and gaps", "one step"])
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
