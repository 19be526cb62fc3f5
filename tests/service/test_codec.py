"""The chunk codec keeps every value bit for bit, NaN apart from missing, for every shape."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from healthsvc.store.batch import MetricBatch
from healthsvc.store import codec
from healthsvc.store.codec import decode_chunk, encode_chunk

floats = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def batches(draw, sizes=st.integers(0, 300)):
    n = draw(sizes)
    steps = np.array(draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n)), dtype=np.int64)
    ranks = np.array(draw(st.lists(st.integers(0, 2**20), min_size=n, max_size=n)), dtype=np.int64)
    b = MetricBatch(steps=steps, ranks=ranks)
    for name in draw(st.lists(st.sampled_from(["loss", "grad_norm", "x.y"]), unique=True, max_size=3)):
        b.values[name] = np.array(draw(st.lists(floats, min_size=n, max_size=n)), dtype=np.float64)
        b.present[name] = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
        b.values[name][~b.present[name]] = np.nan
    if draw(st.booleans()):
        b.host_names = ["a", "b,c"]
        b.host_index = np.array(draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n)), dtype=np.int32)
    for name in draw(st.lists(st.sampled_from(["incarnation", "param_digest"]), unique=True, max_size=2)):
        b.labels[name] = (["p-0", "p-1"], np.array(draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n)),
                                                    dtype=np.int32))
    return b


@settings(max_examples=200, deadline=None)
@given(batches())
def test_round_trip_is_exact(b):
    out = decode_chunk(encode_chunk(b))
    assert np.array_equal(out.steps, b.steps) and np.array_equal(out.ranks, b.ranks)
    assert list(out.values) == list(b.values)
    # The decoder says which fields some record did not report (from the bitmaps it read, not
    # read back from the masks later), as the parser does: what the masks say.
    assert "partial_fields" in vars(out)
    assert out.partial_fields == frozenset(f for f, p in b.present.items() if not p.all())
    for name in b.values:
        assert np.array_equal(out.present[name], b.present[name])
        # Bit-for-bit on reported values (NaN payloads and -0.0 included).
        p = b.present[name]
        assert out.values[name][p].tobytes() == b.values[name][p].tobytes()
    if b.host_index is None:
        assert out.host_index is None
    else:
        assert out.host_names == b.host_names and np.array_equal(out.host_index, b.host_index)
    assert out.labels.keys() == b.labels.keys()
    for name, (names, idx) in b.labels.items():
        assert out.label_column(name) == b.label_column(name)


@settings(max_examples=300, deadline=None)
@given(batches(sizes=st.just(1)))
def test_a_single_record_is_encoded_byte_for_byte_as_the_columns_are(b):
    # A rank's own push takes a shortcut (codec._encode_one_record); it must write what the
    # column-by-column encoding writes.
    names, labels = list(b.values), list(b.labels)
    assert encode_chunk(b) == codec._encode_columns(b, names, b.host_index is not None, labels)


def test_field_selection_and_size():
    n = 4096
    rng = np.random.default_rng(0)
    b = MetricBatch(steps=np.full(n, 7), ranks=np.arange(n))
    for f in ("loss", "grad_norm", "step_time"):
        b.values[f] = 2.0 + 0.1 * rng.standard_normal(n)
        b.present[f] = np.ones(n, bool)
    buf = encode_chunk(b)
    assert len(buf) / (3 * n) < 8.0  # compression pays for the keys
    out = decode_chunk(buf, fields={"loss"})
    assert list(out.values) == ["loss"] and np.array_equal(out.values["loss"], b.values["loss"])


@settings(max_examples=200, deadline=None)
@given(batches(sizes=st.integers(2, 40)))
def test_a_chunk_is_never_larger_than_its_block_stored_raw(b):
    # A few records of noisy values come out of blosc2 larger than they went in (its header):
    # those blocks are kept raw, and say so.
    chunk = encode_chunk(b)
    saved = codec.RAW_BELOW_BYTES
    codec.RAW_BELOW_BYTES = 1 << 62   # nothing compressed
    try:
        raw = encode_chunk(b)
    finally:
        codec.RAW_BELOW_BYTES = saved
    assert len(chunk) <= len(raw)
    assert decode_chunk(chunk).steps.tolist() == b.steps.tolist()


def test_eight_records_of_noise_are_stored_raw_and_read_back():
    rng = np.random.default_rng(3)
    b = MetricBatch(steps=np.arange(8) * 977, ranks=rng.integers(0, 2**20, 8))
    for f in ("loss", "grad_norm", "step_time", "compute_time", "comm_time", "local_grad_norm"):
        b.values[f], b.present[f] = rng.standard_normal(8), np.ones(8, bool)
    chunk = encode_chunk(b)
    assert b'"compressed":false' in chunk[:400]
    out = decode_chunk(chunk)
    assert all(out.values[f].tobytes() == b.values[f].tobytes() for f in b.values)
