"""Encoding stored values for answers: JSON keeps NaN and infinities as the strings "NaN",
"Infinity", "-Infinity" (JSON has no such numbers and orjson would write null, which means "not
reported"); CSV writes ``nan``, ``inf``, ``-inf`` and leaves a missing value empty."""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import orjson


def float_column_to_json(values: np.ndarray, present: np.ndarray) -> list[Any]:
    """A float column as JSON-ready Python values: numbers, non-finite strings, None if missing."""
    out = values.tolist()
    odd = np.flatnonzero(~np.isfinite(values) | ~present)
    for i in odd.tolist():
        if not present[i]:
            out[i] = None
        else:
            v = out[i]
            out[i] = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return out


def json_value(v: Any) -> Any:
    """One float for a JSON answer (non-finite as strings)."""
    if isinstance(v, float) and not np.isfinite(v):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return v


def dumps(obj: Any) -> bytes:
    """orjson with numpy support; callers convert non-finite floats first."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _float_strings(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    text = values.astype(str)  # numpy writes shortest round-trip reprs and nan/inf/-inf
    if not present.all():
        text = text.astype(object)
        text[~present] = ""
    return text


def csv_lines(header: list[str], columns: list[np.ndarray]) -> Iterable[str]:
    """CSV text for string columns of equal length (no quoting needed: names and numbers only,
    host names are checked by :func:`csv_safe`)."""
    if not columns or len(columns[0]) == 0:
        return []
    joined = columns[0].astype(object)
    for col in columns[1:]:
        joined = joined + "," + col.astype(object)
    return ["\n".join(joined.tolist()) + "\n"]


def csv_safe(text: str | None) -> str:
    if text is None:
        return ""
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def csv_float_column(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    return _float_strings(values, present)
