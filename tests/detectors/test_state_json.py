"""Detector state arrays through JSON: every value comes back as it went, NaN and infinities
included, whatever the array's shape, and the text is plain JSON (no NaN tokens)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.stats.state_json import array_from_json, array_to_json


@pytest.mark.parametrize("shape", [(0,), (7,), (3, 5), (2, 3, 4), (64,), (1000,), (16, 8), (2, 40)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_an_array_comes_back_from_strict_json_as_it_went(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    a = (rng.standard_normal(shape) * 1e3).astype(dtype)
    if a.dtype.kind == "f" and a.size:
        flat = a.reshape(-1)
        flat[rng.integers(0, a.size, 3)] = [np.nan, np.inf, -np.inf]
    text = json.dumps(array_to_json(a), allow_nan=False)   # raises on a NaN token
    back = array_from_json(json.loads(text), np.dtype(dtype))
    assert back.dtype == a.dtype and back.shape == a.shape
    assert np.array_equal(back, a, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32, np.bool_])
def test_a_large_array_is_written_as_its_bytes_and_read_back_writable_in_the_dtype_asked(dtype):
    a = (np.arange(300) % 7).astype(dtype)
    state = json.loads(json.dumps(array_to_json(a), allow_nan=False))
    assert isinstance(state, dict) and state["shape"] == [300]
    back = array_from_json(state, np.dtype(np.float64))
    assert back.dtype == np.float64 and np.array_equal(back, a.astype(np.float64))
    back[0] = 99.0   # the detectors update their restored arrays in place


def test_a_large_array_written_as_a_list_by_an_earlier_version_still_loads():
    values = [1.5, "nan", "-inf"] + [0.25] * 200
    back = array_from_json(values, np.dtype(np.float32))
    assert back.dtype == np.float32 and np.isnan(back[1]) and back[2] == -np.inf and back[-1] == 0.25


def test_a_bytes_form_of_an_object_dtype_is_refused():
    import base64
    with pytest.raises(ValueError):
        array_from_json({"dtype": "|O", "shape": [1], "base64": base64.b64encode(b"\0" * 8).decode()},
                        np.dtype(np.float64))
