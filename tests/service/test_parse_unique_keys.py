"""A push may hold each (step, rank) once. The check takes a set of pairs for a few records, one
pass for records in (step, rank) order, and a sort otherwise: whichever way, a push is refused
exactly when a pair repeats, and the error points at a record of that pair."""
from __future__ import annotations

import numpy as np
import orjson
import pytest

from healthsvc.errors import InvalidInput
from healthsvc.ingest.parse import parse_metrics


@pytest.mark.parametrize("form", ["columns", "rows"])
def test_a_push_is_refused_exactly_when_a_step_and_rank_repeat(form):
    rng = np.random.default_rng(3)
    for trial in range(400):
        n = int(rng.choice([2, 3, 8, 32, 33, 64, 500]))
        steps = np.sort(rng.integers(0, 4, n)) if trial % 2 else rng.integers(0, 4, n)
        ranks = rng.integers(0, n if trial % 3 else 3 * n, n)
        if trial % 5 == 0:   # the usual push: in (step, rank) order, all distinct
            steps, ranks = np.repeat(np.arange(n // 2 + 1), 2)[:n], np.tile([0, 1], n)[:n]
        cols = {"step": steps.tolist(), "rank": ranks.tolist(), "loss": [1.5] * n}
        body = orjson.dumps({"columns": cols} if form == "columns"
                            else {"records": [dict(zip(cols, vals)) for vals in zip(*cols.values())]})
        pairs = list(zip(steps.tolist(), ranks.tolist()))
        repeats = len(set(pairs)) < n
        if not repeats:
            batch, _ = parse_metrics(body)
            assert batch.steps.tolist() == steps.tolist() and batch.ranks.tolist() == ranks.tolist()
            continue
        with pytest.raises(InvalidInput, match="appears twice") as err:
            parse_metrics(body)
        loc = err.value.detail()[0]["loc"]
        at = loc[2] if form == "rows" else loc[3]
        assert pairs.count(pairs[at]) > 1, (trial, loc)
