"""Turning queued values into request bodies: scalars to JSON numbers, NaN kept as NaN, gzip.

Runs on the sender thread, never on the training thread: that is where a torch tensor or numpy
scalar handed to ``log()`` becomes a float (``float(x)``; for a CUDA tensor that is the device sync
the training thread did not pay).

NaN and infinities leave as the JSON tokens ``NaN``/``Infinity``/``-Infinity`` (``json.dumps``
with ``allow_nan=True``), never as ``null``: null means "not reported" on the wire.

Example::

    >>> encode_json({"records": [{"step": 1, "rank": 0, "loss": float("nan")}]})
    b'{"records":[{"step":1,"rank":0,"loss":NaN}]}'
"""
from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterable, Mapping  # noqa: F401
from typing import Any, TypeVar

T = TypeVar("T")

_PASSTHROUGH = (bool, int, float, str, type(None))


def to_scalar(value: Any) -> float | int | str | bool | None:
    """A JSON-ready scalar from a Python, numpy or torch number (0-d or 1-element tensor).

    Raises TypeError/ValueError when ``value`` is not a scalar; the caller counts and drops it.
    """
    if isinstance(value, _PASSTHROUGH):
        return value
    item = getattr(value, "item", None)  # numpy scalars/arrays and torch tensors
    if item is not None:
        detach = getattr(value, "detach", None)
        if detach is not None:
            value = detach()
        return to_scalar(value.item())
    return float(value)


def is_non_finite(value: Any) -> bool:
    """True for a float NaN/Inf. Cheap enough for the training thread: other types answer False
    (they are converted, and checked again, on the sender thread)."""
    return value.__class__ is float and not math.isfinite(value)


def merge_by_step(rows: Iterable[tuple[int, float, dict]]) -> list[tuple[int, float, dict]]:
    """Fold several ``log()`` calls for the same step into one record (later values win).

    ``rows`` are (step, ts, metrics) with ``metrics`` owned by the caller (not copied unless two
    rows share a step); order of first appearance is kept.

        >>> merge_by_step([(1, 0.0, {"loss": 1.0}), (2, 0.1, {"loss": 2.0}), (1, 0.2, {"lr": 0.1})])
        [(1, 0.2, {'loss': 1.0, 'lr': 0.1}), (2, 0.1, {'loss': 2.0})]
    """
    merged: dict[int, tuple[int, float, dict]] = {}
    for step, ts, metrics in rows:
        previous = merged.get(step)
        if previous is None:
            merged[step] = (step, ts, metrics)
        else:
            merged[step] = (step, max(ts, previous[1]), {**previous[2], **metrics})
    return list(merged.values())


def runs_of(items: list[T], key: Callable[[T], Any]) -> list[list[T]]:
    """``items`` cut where ``key`` changes, in order.

        >>> runs_of([1, 1, 2, 1], lambda x: x)
        [[1, 1], [2], [1]]
    """
    runs: list[list[T]] = []
    last: Any = object()
    for item in items:
        k = key(item)
        if not runs or k != last:
            runs.append([])
            last = k
        runs[-1].append(item)
    return runs


def concat_columns(blocks: Iterable[Mapping[str, list]]) -> dict[str, list]:
    """Concatenate columnar blocks; a column absent from a block is filled with None (not reported).

    Example::

        >>> concat_columns([{"rank": [0, 1], "loss": [1.0, 2.0]}, {"rank": [0], "lr": [0.1]}])
        {'rank': [0, 1, 0], 'loss': [1.0, 2.0, None], 'lr': [None, None, 0.1]}
    """
    blocks = list(blocks)
    names: list[str] = []
    for block in blocks:
        for name in block:
            if name not in names:
                names.append(name)
    out: dict[str, list] = {name: [] for name in names}
    for block in blocks:
        length = max((len(col) for col in block.values()), default=0)
        for name in names:
            col = block.get(name)
            out[name].extend(col if col is not None else [None] * length)
    return out


def encode_json(body: Any) -> bytes:
    """Compact JSON, NaN/Infinity as tokens."""
    return json.dumps(body, allow_nan=True, separators=(",", ":")).encode()


def maybe_gzip(data: bytes, min_bytes: int) -> tuple[bytes, dict[str, str]]:
    """Gzip ``data`` when it is at least ``min_bytes`` long; returns (body, extra headers).

    ``mtime=0`` keeps the bytes a pure function of the input, so a retried body is identical.
    """
    if min_bytes < 0 or len(data) < min_bytes:
        return data, {}
    return gzip.compress(data, compresslevel=5, mtime=0), {"Content-Encoding": "gzip"}
