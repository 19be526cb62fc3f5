"""Encoding values for JSON: NaN and infinities become the strings "NaN", "Infinity", "-Infinity"
(JSON has no such numbers, and orjson or pydantic would write null, which means "not reported").
Columnar exports are in ``export``."""
from __future__ import annotations

import math
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


def jsonable(obj: Any) -> Any:
    """A structure made JSON-safe without losing non-finite numbers: NaN/±Inf floats (also numpy
    scalars and arrays) become the wire strings; dict keys become strings."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return jsonable(obj.tolist())
    return obj


def dumps(obj: Any) -> bytes:
    """orjson with numpy support; callers convert non-finite floats first."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
