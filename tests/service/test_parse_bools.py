"""A boolean is no step or rank: numpy reads ``[1, true]`` as the integers ``[1, 1]``, so the
parse looks for booleans among the elements read as 0 or 1 only (``_holds_bool``). It must say
what a check of every element's type says, for any column."""
from __future__ import annotations

import numpy as np
import orjson
import pytest

from healthsvc.errors import InvalidInput
from healthsvc.ingest.parse import _holds_bool, parse_metrics


def test_a_column_holds_a_boolean_exactly_when_one_of_its_elements_is_one():
    rng = np.random.default_rng(11)
    for trial in range(3000):
        n = int(rng.choice([1, 2, 3, 10, 64, 65, 200, 1024]))
        hi = int(rng.choice([2, 5, 1000, 2 ** 62]))
        col: list = rng.integers(0, hi, n).tolist()
        if trial % 7 == 0:
            col = [2 ** 63 + 5 if x % 2 else x for x in col]   # numpy reads these as uint64
        for _ in range(int(rng.choice([0, 0, 1, 2, 5]))):
            col[int(rng.integers(0, n))] = bool(rng.integers(0, 2))
        arr = np.array(col)
        if arr.dtype.kind not in "iu":   # all booleans: refused by its dtype before this check
            continue
        assert _holds_bool(col, arr) == (bool in set(map(type, col))), (trial, col[:20])


@pytest.mark.parametrize("field", ["step", "rank"])
@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("n", [2, 1024])
def test_a_push_with_a_boolean_step_or_rank_is_refused_wherever_it_is(field, value, n):
    for at in (0, n // 2, n - 1):
        cols = {"step": [7] * n, "rank": list(range(n)), "loss": [1.0] * n}
        cols[field][at] = value
        with pytest.raises(InvalidInput) as err:
            parse_metrics(orjson.dumps({"columns": cols}))
        assert err.value.detail()[0]["loc"] == ["body", "columns", field, at], err.value.detail()


@pytest.mark.parametrize("form", ["columns", "records"])
def test_in_either_form_a_push_is_refused_exactly_when_a_step_or_rank_is_a_boolean(form):
    """Rows and columns alike, at the size where the element check changes its way (64), with
    host names that spell ``true`` and ``false``: refused, at the boolean, exactly when one was
    planted. (Looking for the tokens in the body's bytes first was tried as a way to skip the
    check: a scan of a 64-record body costs six times the check it would skip.)"""
    rng = np.random.default_rng(5)
    for trial in range(400):
        n = int(rng.choice([1, 2, 5, 64, 100]))
        cols: dict = {"step": [3] * n, "rank": list(range(n)), "loss": rng.random(n).tolist(),
                      "host": [str(rng.choice(["node-1", "trueno", "falsetto"])) for _ in range(n)]}
        planted = None
        if trial % 3 == 0:
            planted = (str(rng.choice(["step", "rank"])), int(rng.integers(0, n)))
            cols[planted[0]][planted[1]] = bool(rng.integers(0, 2))
        body = orjson.dumps({"columns": cols} if form == "columns"
                            else {"records": [dict(zip(cols, vals)) for vals in zip(*cols.values())]})
        if planted is None:
            batch, _ = parse_metrics(body)
            assert batch.steps.tolist() == cols["step"] and batch.ranks.tolist() == cols["rank"]
        else:
            with pytest.raises(InvalidInput) as err:
                parse_metrics(body)
            field, at = planted
            expected = ["body", "columns", field, at] if form == "columns" else ["body", "records", at, field]
            assert err.value.detail()[0]["loc"] == expected, (trial, err.value.detail())
