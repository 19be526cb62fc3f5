"""What the dashboard's JSON endpoints compute: plain functions over the rollups and the store.

Each returns a dict shaped like its response model in ``schemas.py``. Nothing here reads the raw
history, so every answer costs the same for 8 ranks or 16,384.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from healthsvc.dashboard.downsample import bucket_envelope, lttb, rebin_heat
from healthsvc.dashboard.hub import RollupHub
from healthsvc.dashboard.rollup import LINE_FIELDS, MAX_RANK_BINS, RunRollup
from healthsvc.errors import InvalidInput

MAX_NONFINITE_STEPS = 1000


def _row(health, base: dict[str, Any]) -> dict[str, Any]:
    sec = health.summary(base["run_id"])
    active = sec["active_findings"]
    return {**base, "health": sec["health"], "active_findings": len(active),
            "active_kinds": sorted({f["kind"] for f in active})}


def runs(summaries, health) -> list[dict[str, Any]]:
    """Every run with its health. Not ``GET /v1/runs?detail``: that asks the rollback answer of
    every run, which reads history; the runs page needs only the findings."""
    return [_row(health, base) for base in summaries.list()]


def run_detail(summaries, health, hub: RollupHub, run_id: str) -> dict[str, Any]:
    base = summaries.summary(run_id, detail=False)  # NotFound (404) for an unknown run
    base["attempts"] = summaries.store.reads.attempts(run_id)
    last = hub.read(run_id, lambda r: r.last_step)
    # Asked here so the page requests GET .../bisection only when there is one (no 404 to log).
    bisecting = summaries.store.bisections.exists(run_id)
    return {**_row(health, base), "rollup_last_step": -1 if last is None else last,
            "catching_up": hub.catching_up, "has_bisection": bisecting}


def _check_range(step_min: int | None, step_max: int | None) -> None:
    """A 422 for a step range that ends before it starts, whether or not the run has a rollup yet."""
    if step_min is not None and step_max is not None and step_max < step_min:
        raise InvalidInput("step_max must be >= step_min", loc=("query", "step_max"))


def _range(r: RunRollup, step_min: int | None, step_max: int | None) -> tuple[int, int]:
    lo = 0 if step_min is None else step_min
    hi = r.last_step if step_max is None else min(step_max, r.last_step)
    return lo, hi


def _field_series(stats: dict[str, np.ndarray], lo: int, hi: int, points: int) -> dict[str, Any] | None:
    reported = stats["reported"][lo:hi + 1]
    has = np.flatnonzero(reported > 0)
    if len(has) == 0:
        return None
    steps = lo + has                       # only steps some rank reported
    med = stats["median"][steps]
    idx = lttb(steps, med, points)
    band_lo, band_hi = bucket_envelope(stats["min"][steps], stats["max"][steps], points)
    nf = np.flatnonzero(stats["nonfinite"][steps] > 0)[:MAX_NONFINITE_STEPS]
    return {"steps": steps[idx], "median": med[idx], "min": band_lo, "max": band_hi,
            "nonfinite_steps": steps[nf], "nonfinite_ranks": stats["nonfinite"][steps[nf]]}


def series(hub: RollupHub, run_id: str, fields: list[str], step_min: int | None, step_max: int | None,
           points: int) -> dict[str, Any]:
    _check_range(step_min, step_max)
    unknown = [f for f in fields if f not in LINE_FIELDS]
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r}; the dashboard keeps {', '.join(LINE_FIELDS)}",
                           loc=("query", "fields"))

    def read(r: RunRollup) -> dict[str, Any]:
        lo, hi = _range(r, step_min, step_max)
        out = {}
        for f in fields:
            s = _field_series(r.lines[f], lo, hi, points) if hi >= lo else None
            if s is not None:
                out[f] = s
        return {"step_min": lo, "step_max": hi, "fields": out}

    got = hub.read(run_id, read)
    if got is None:
        got = {"step_min": step_min or 0, "step_max": step_max or 0, "fields": {}}
    return {"run_id": run_id, "points": points, **got}


def heatmap(hub: RollupHub, run_id: str, field: str, step_min: int | None, step_max: int | None,
            max_cols: int) -> dict[str, Any]:
    _check_range(step_min, step_max)

    def read(r: RunRollup) -> dict[str, Any] | None:
        grid = r.heat.get(field)
        if grid is None:
            return None
        lo, hi = _range(r, step_min, step_max)
        c_lo, c_hi = lo // grid.step_width, max(lo, hi) // grid.step_width + 1
        n_rows = min(MAX_RANK_BINS, r.max_rank // grid.rank_width + 1)
        mean, k = rebin_heat(grid.sums[:n_rows], grid.counts[:n_rows], c_lo, c_hi, max_cols)
        if len(mean) < n_rows:   # ranks past the grid's rows have not reported this field
            mean = np.vstack([mean, np.full((n_rows - len(mean), mean.shape[1]), np.nan)])
        return {"grid": mean, "k": k, "c_lo": c_lo, "rank_width": grid.rank_width, "step_width": grid.step_width}

    got = hub.read(run_id, read)
    if got is None:
        return {"run_id": run_id, "field": field, "step_min": 0, "step_width": 1, "rank_width": 1,
                "n_rows": 0, "n_cols": 0, "values": [], "hottest": None}
    grid, rw = got["grid"], got["rank_width"]
    hottest = None
    counts = np.isfinite(grid).sum(axis=1)
    row_mean = np.where(counts > 0, np.nansum(grid, axis=1) / np.maximum(counts, 1), np.nan)
    if np.isfinite(row_mean).any():
        row = int(np.nanargmax(row_mean))
        hottest = {"row": row, "rank_lo": row * rw, "rank_hi": row * rw + rw - 1,
                   "ratio": round(float(row_mean[row]), 3)}
    values = np.round(grid.astype(np.float64), 3)
    return {"run_id": run_id, "field": field, "step_min": got["c_lo"] * got["step_width"],
            "step_width": got["step_width"] * got["k"], "rank_width": rw, "n_rows": grid.shape[0],
            "n_cols": grid.shape[1], "values": values, "hottest": hottest}
