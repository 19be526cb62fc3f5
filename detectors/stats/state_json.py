"""Numbers in a detector's JSON state dict. JSON has no NaN, and the service's encoder may not
keep one, so non-finite floats are written as the strings ``'nan'``, ``'inf'``, ``'-inf'``.

>>> array_to_json(np.array([1.5, np.nan, -np.inf]))
[1.5, 'nan', '-inf']
>>> array_from_json(['nan', 2.0], np.dtype(np.float64)).tolist()
[nan, 2.0]

An array of ``BINARY_FROM`` values or more is written as its bytes instead, in base64 with its
dtype and shape (still strict JSON; NaN and infinities are bits like any other value). A
1,024-rank run's monitor snapshot, taken every few seconds on the run owner's thread, was mostly
Python floats made by ``tolist()`` and written out one by one as decimal text; bytes cost a
small part of that and take fewer characters (``bench/monitor_snapshot.py``: half the time
to write at 1,024 and 16,384 ranks, a third to a quarter to read).
``array_from_json`` reads both forms, so snapshots written before load as they did.

>>> state = array_to_json(np.arange(64, dtype=np.float32))
>>> sorted(state), state["dtype"], state["shape"]
(['base64', 'dtype', 'shape'], '<f4', [64])
>>> float(array_from_json(state, np.dtype(np.float64))[-1])
63.0
"""
from __future__ import annotations

import base64
from typing import Any

import numpy as np

BINARY_FROM = 64   # values; smaller arrays stay lists (readable in a snapshot, and no cheaper as bytes)


def array_to_json(a: np.ndarray) -> Any:
    if a.size >= BINARY_FROM and a.dtype.kind in _BINARY_KINDS:
        a = np.ascontiguousarray(a)
        return {"dtype": a.dtype.str, "shape": list(a.shape), "base64": base64.b64encode(a.data).decode("ascii")}
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


def array_from_json(values: Any, dtype: np.dtype) -> np.ndarray:
    """The array ``array_to_json`` wrote, as ``dtype`` (a fresh, writable array from the bytes form)."""
    if isinstance(values, dict):
        stored = np.dtype(values["dtype"])
        if stored.kind not in _BINARY_KINDS:
            raise ValueError(f"state array of dtype {stored} (numbers and booleans only)")
        raw = np.frombuffer(base64.b64decode(values["base64"], validate=True), stored)
        return raw.reshape([int(n) for n in values["shape"]]).astype(dtype)
    # numpy reads the strings 'nan', 'inf' and '-inf' itself, as float() does.
    return np.asarray(values, dtype=dtype)


_BINARY_KINDS = "fiub"
