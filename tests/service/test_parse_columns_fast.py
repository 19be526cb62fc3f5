"""The columns form's fast decode (simdjson straight into numpy, ``_numeric_columns``) must say
exactly what the general path (orjson, then ``np.array`` per column) says, for any body: the same
batch and idempotency key, or the same error at the same place. It only takes bodies it reads
as they are; the general path decides everything else."""
from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthsvc.errors import HealthsvcError
from healthsvc.ingest import parse
from healthsvc.ingest.parse import _numeric_columns, parse_metrics


@pytest.fixture(autouse=True)
def fast_decode_for_small_bodies_too(monkeypatch):
    """The fast decode waits for bodies of FAST_COLUMNS_MIN_BYTES (where it pays); here it takes
    every body, so that small generated bodies test it too."""
    monkeypatch.setattr(parse, "FAST_COLUMNS_MIN_BYTES", 0)


def outcome(body: bytes, *, fast: bool):
    """What parse_metrics makes of ``body``: the batch's parts and the key, or the error."""
    saved = parse._numeric_columns
    if not fast:
        parse._numeric_columns = lambda body, max_names: None
    try:
        batch, digest = parse_metrics(body, max_ranks=1 << 20, max_names=8)
    except HealthsvcError as exc:
        return ("error", type(exc).__name__, str(exc), exc.detail())
    finally:
        parse._numeric_columns = saved
    return ("batch", digest, batch.steps.dtype.str, batch.steps.tolist(), batch.ranks.tolist(),
            {f: (v.dtype.str, v.tobytes(), batch.present[f].tolist()) for f, v in batch.values.items()},
            batch.host_names, None if batch.host_index is None else batch.host_index.tolist(),
            {f: (names, idx.tolist()) for f, (names, idx) in batch.labels.items()})


def usual_push(n: int, **extra) -> dict:
    cols = {"step": [100] * n, "rank": list(range(n)), "loss": [1.0 + i / 7 for i in range(n)],
            "grad_norm": list(range(n)), "host": [f"node{i // 8}" for i in range(n)]}
    return {"batch_id": "relay-1", "columns": {**cols, **extra}}


def test_a_relays_push_is_read_by_the_fast_decode_and_parses_the_same():
    body = orjson.dumps(usual_push(64))
    assert _numeric_columns(body, 8) is not None   # the fast decode takes it (else this test tests nothing)
    assert outcome(body, fast=True) == outcome(body, fast=False)
    assert outcome(body, fast=True)[1] == "id:relay-1"


@pytest.mark.parametrize("column, value", [
    ("loss", None), ("loss", "NaN"), ("loss", True), ("loss", [1.0]), ("loss", {"a": 1}),
    ("step", 1.0), ("step", -1), ("step", True), ("step", 2 ** 63), ("step", [3]), ("rank", 2 ** 21),
    ("host", 3), ("host", None), ("host", "x" * 300), ("grad_norm", 2 ** 64 - 1), ("grad_norm", 10 ** 30),
])
def test_a_column_the_fast_decode_does_not_take_as_it_is_gets_the_general_paths_answer(column, value):
    push = usual_push(64)
    push["columns"][column][17] = value
    body = orjson.dumps(push) if value != 10 ** 30 else json.dumps(push).encode()
    assert outcome(body, fast=True) == outcome(body, fast=False)


def test_what_the_fast_decode_leaves_to_the_general_path():
    cases = {
        "a nested list of one element (simdjson's buffer would flatten it)":
            b'{"columns":{"step":[1,2],"rank":[0,0],"loss":[[1.5],2.5],"grad_norm":[1.0,2.0]}}',
        "a repeated column": b'{"columns":{"step":[1,2],"rank":[0,0],"loss":[1.5,2.5],"loss":[1.0,2.0]}}',
        "a NaN token": b'{"columns":{"step":[1,2],"rank":[0,0],"loss":[NaN,2.5],"grad_norm":[1.0,2.0]}}',
        "columns of unequal lengths": b'{"columns":{"step":[1,2],"rank":[0,0],"loss":[1.5],"grad_norm":[1.0,2.0]}}',
        "another top-level key": b'{"columns":{"step":[1,2],"rank":[0,0],"loss":[1.5,2.5]},"extra":[1,2,3,4,5]}',
        "a batch id that is no string": b'{"batch_id":7,"columns":{"step":[1,2],"rank":[0,0],"loss":[1.5,2.5]}}',
        "a null": b'{"columns":{"step":[1,2],"rank":[0,0],"loss":[null,2.5],"grad_norm":[1.0,2.0]}}',
    }
    for why, body in cases.items():
        assert _numeric_columns(body, 8) is None, why
        assert outcome(body, fast=True) == outcome(body, fast=False), why


values = st.one_of(st.integers(-3, 2 ** 64), st.floats(allow_nan=False, allow_infinity=False), st.none(),
                   st.booleans(), st.sampled_from(["NaN", "Infinity", "a", "[", ""]), st.lists(st.integers(0, 3), max_size=2))
names = st.sampled_from(["step", "rank", "loss", "grad_norm", "host", "param_digest", "replica_group", "bad name", "attempt"])


@st.composite
def column_bodies(draw) -> bytes:
    n = draw(st.integers(0, 12))
    # Half the bodies well-formed (the fast decode takes most of them), half with odd parts.
    odd = draw(st.booleans())
    chosen = draw(st.lists(names, min_size=1, max_size=7, unique=True))
    if not odd:
        chosen = ["step", "rank"] + [c for c in chosen if c not in ("step", "rank", "bad name", "attempt")]
    cols = {}
    for name in chosen:
        if name in ("step", "rank"):
            base = st.integers(0, 50)
        elif name in ("host", "param_digest"):
            base = st.sampled_from(["a", "b", "node-7"])
        else:
            base = st.floats(allow_nan=False, allow_infinity=False, width=64)
        # Mostly well-formed columns, so that the fast decode takes many bodies; a few odd values.
        col = draw(st.lists(st.one_of(base, base, base, values) if odd else base, min_size=n, max_size=n))
        if odd and draw(st.integers(0, 9)) == 0:
            col = col[:-1]
        cols[name] = col
    doc: dict = {"columns": cols}
    if draw(st.booleans()):
        doc["batch_id"] = draw(st.one_of(st.text(min_size=1, max_size=5), st.integers(0, 3)) if odd
                               else st.text(min_size=1, max_size=5))
    if odd and draw(st.integers(0, 9)) == 0:
        doc["records"] = []
    text = json.dumps(doc, indent=draw(st.sampled_from([None, 1])))
    return text.encode()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=column_bodies())
def test_any_columns_body_parses_the_same_either_way(body):
    assert outcome(body, fast=True) == outcome(body, fast=False), body


def test_the_fast_decode_reads_a_thousand_records_as_the_general_path_does():
    rng = np.random.default_rng(5)
    push = usual_push(1024)
    push["columns"]["loss"] = (rng.standard_normal(1024) * 10.0 ** rng.integers(-300, 300, 1024)).tolist()
    body = orjson.dumps(push)
    assert _numeric_columns(body, 8) is not None
    assert outcome(body, fast=True) == outcome(body, fast=False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=column_bodies(), rows=st.booleans())
def test_the_parsers_partial_fields_and_point_count_are_what_the_columns_say(body, rows):
    # The parser sets partial_fields as it builds the batch (the codec then writes no bitmap for
    # the others) and n_points follows from it: both must be what counting the columns gives, in
    # either form and either decode, or a chunk would store a missing value as 0.0.
    if rows:
        doc = json.loads(body)
        cols = doc.get("columns")
        if not isinstance(cols, dict) or len({len(c) for c in cols.values() if isinstance(c, list)}) != 1 \
                or not all(isinstance(c, list) for c in cols.values()):
            return
        n = len(next(iter(cols.values())))
        doc = {"records": [{k: c[i] for k, c in cols.items() if c[i] is not None} for i in range(n)]}
        body = json.dumps(doc).encode()   # not orjson: the columns may hold integers past 64 bits
    try:
        batch, _ = parse_metrics(body, max_ranks=1 << 20, max_names=8)
    except HealthsvcError:
        return
    counted = batch.__class__(batch.steps, batch.ranks, batch.values, batch.present, batch.host_names,
                              batch.host_index, batch.labels)   # the same columns, nothing known yet
    assert batch.partial_fields == counted.partial_fields == {f for f, p in batch.present.items() if not p.all()}
    assert batch.n_points == counted.n_points == sum(int(p.sum()) for p in batch.present.values()) + \
        sum(int((idx >= 0).sum()) for _, idx in batch.labels.values())


@pytest.mark.parametrize("n", [1, 64, 70_000])
def test_each_batchs_present_masks_are_its_own(n):
    """The all-present masks come from one shared template: each is a fresh, writable array, so
    a reader that clears a record in one batch (the codec, the aligner's joins) touches no other."""
    body = orjson.dumps({"columns": {"step": list(range(n)), "rank": [0] * n,
                                     "loss": [1.5] * n, "grad_norm": [2.5] * n}})
    first, _ = parse_metrics(body)
    second, _ = parse_metrics(body)
    masks = [first.present["loss"], first.present["grad_norm"], second.present["loss"]]
    assert all(m.flags.writeable and m.all() and len(m) == n for m in masks)
    masks[0][0] = False
    assert masks[1][0] and masks[2][0] and parse_metrics(body)[0].present["loss"][0]
