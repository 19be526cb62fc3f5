"""Numbers in a detector's JSON state dict. JSON has no NaN, and the service's encoder may not
keep one, so non-finite floats are written as the strings ``'nan'``, ``'inf'``, ``'-inf'``.

>>> array_to_json(np.array([1.5, np.nan, -np.inf]))
[1.5, 'nan', '-inf']
>>> array_from_json(['nan', 2.0], np.dtype(np.float64)).tolist()
[nan, 2.0]
"""
from __future__ import annotations

import numpy as np


def array_to_json(a: np.ndarray) -> list:
    # JSON has no NaN: encode non-finite floats as strings so state survives any JSON encoder.
    # numpy's tolist() makes the list in C; only the non-finite entries are replaced, by index
    # (a 16,384-rank run's detector state has several such arrays, written every few seconds
    # on the run owner's thread: a loop over every value held its pages back by a second).
    if a.ndim > 1:
        return [array_to_json(row) for row in a]
    out = a.tolist()
    if a.dtype.kind == "f":
        for i in np.flatnonzero(~np.isfinite(a)).tolist():
            out[i] = repr(out[i])
    return out


def array_from_json(values: list, dtype: np.dtype) -> np.ndarray:
    # numpy reads the strings 'nan', 'inf' and '-inf' itself, as float() does.
    return np.asarray(values, dtype=dtype)
