"""Encoding stored values for JSON answers: NaN and infinities become the strings "NaN",
"Infinity", "-Infinity" (JSON has no such numbers, and orjson would write null, which means "not
reported"). Columnar exports are in ``export``."""
from __future__ import annotations

from typing import Any

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
