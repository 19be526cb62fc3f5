"""Response models of the dashboard's JSON endpoints (documented in the OpenAPI schema)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class DashboardRun(BaseModel):
    """One row of the runs page."""
    run_id: str = Field(..., description="The run's identifier.")
    status: str = Field(..., description="running | finished.")
    health: str = Field(..., description="ok | warning | critical: the worst active finding.")
    last_step: int | None = Field(None, description="Highest step of the current attempt.")
    world_size: int | None = Field(None, description="Configured world size, else ranks seen.")
    attempt: int = Field(..., description="Current attempt (0 before any metrics); attempts - 1 restarts.")
    active_findings: int = Field(..., description="Findings still firing, count.")
    active_kinds: list[str] = Field(default_factory=list, description="Kinds of the active findings.")
    last_push: float | None = Field(None, description="Last accepted metrics push, unix seconds.")
    created_at: float = Field(..., description="Unix seconds.")
    finished_at: float | None = Field(None, description="Unix seconds.")


class DashboardRunDetail(DashboardRun):
    """The run page's header: the row plus every attempt (no rollback: that is its own request)."""
    attempts: list[dict[str, Any]] = Field(default_factory=list, description="Every attempt, oldest first.")
    ranks_seen: int = Field(0, description="Ranks that reported in the current attempt.")
    config: dict[str, Any] = Field(default_factory=dict, description="The run's configuration.")
    rollup_last_step: int = Field(-1, description="Highest step folded into the dashboard rollup (-1: none yet).")
    catching_up: bool = Field(False, description="True while the rollups replay stored history after a restart.")
    has_bisection: bool = Field(False, description="True when the run has a bisection (GET .../bisection).")


class FieldSeries(BaseModel):
    """One field's curve: the kept steps, the median at each, and the band around it."""
    steps: list[int] = Field(..., description="Steps of the kept points (x), ascending.")
    median: list[float | None] = Field(..., description="Cross-rank median of the finite values at each kept "
                                                         "step (LTTB-selected); null where no rank had one.")
    min: list[float | None] = Field(..., description="Lowest per-rank value over each point's bucket of steps.")
    max: list[float | None] = Field(..., description="Highest per-rank value over each point's bucket of steps.")
    nonfinite_steps: list[int] = Field(..., description="Steps where some rank reported NaN/±Inf (at most 1,000, "
                                                         "over the requested range, not downsampled).")
    nonfinite_ranks: list[int] = Field(..., description="How many ranks were non-finite at each of nonfinite_steps.")


class SeriesOut(BaseModel):
    """Per-step curves of a run, downsampled."""
    run_id: str = Field(..., description="The run.")
    step_min: int = Field(..., description="First step covered.")
    step_max: int = Field(..., description="Last step covered.")
    points: int = Field(..., description="The requested number of points per series.")
    fields: dict[str, FieldSeries] = Field(..., description="Per field (loss, grad_norm, step_time; those reported).")


class HeatmapOut(BaseModel):
    """A metric per rank over steps, binned: rows are rank bins, columns step bins."""
    run_id: str = Field(..., description="The run.")
    field: str = Field(..., description="The metric shown.")
    scale: str = Field("ratio to the step's cross-rank median",
                       description="What a value means: 2.0 is twice the median of its step.")
    step_min: int = Field(..., description="First step of the first column.")
    step_width: int = Field(..., description="Steps per column.")
    rank_width: int = Field(..., description="Ranks per row; a row shows the highest ratio among its ranks.")
    n_rows: int = Field(..., description="Rows (rank bins) that hold ranks.")
    n_cols: int = Field(..., description="Columns (step bins), count.")
    values: list[list[float | None]] = Field(..., description="values[row][col]: mean over the column's steps "
                                                               "of the row's highest ratio; null where nothing was reported.")
    hottest: dict[str, Any] | None = Field(None, description="The row with the highest mean ratio: "
                                                             "{row, rank_lo, rank_hi, ratio}.")
