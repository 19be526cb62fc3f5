"""Detector state arrays through JSON: every value comes back as it went, NaN and infinities
included, whatever the array's shape, and the text is plain JSON (no NaN tokens)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.stats.state_json import array_from_json, array_to_json


@pytest.mark.parametrize("shape", [(0,), (7,), (3, 5), (2, 3, 4)])
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
