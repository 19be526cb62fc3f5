"""The two scales every value detector judges on.

- :func:`log_positive` — values in log space (non-positive or non-finite values become invalid);
- :func:`excess_score` — the common score scale: 0 at the firing threshold, 1 at the level the
  detector calls as bad as it gets.
"""
from __future__ import annotations

import numpy as np


def log_positive(x: np.ndarray, present: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(log(x), valid)``: valid where reported, finite and > 0; log is NaN elsewhere.

    Loss and gradient norms are positive; a non-finite value is the ``non_finite`` detector's
    business, and a cell that is not present is never a value at all.
    """
    valid = (x > 0) & (x < np.inf)      # NaN compares False
    if present is not None:
        valid &= present
    y = np.full(x.shape, np.nan)
    np.log(x, out=y, where=valid)       # only where valid: no warnings, no second pass
    return y, valid


def excess_score(stat: np.ndarray | float, warn: float, crit: float) -> np.ndarray | float:
    """Score in [0, 1]: 0 at ``warn`` (the firing threshold), 1 at and beyond ``crit``."""
    span = max(crit - warn, 1e-12)
    return np.clip((np.asarray(stat, dtype=np.float64) - warn) / span, 0.0, 1.0)
