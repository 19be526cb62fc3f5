"""The dashboard over HTTP: its pages (``/``, ``/runs/{run_id}``), its static assets, and the JSON
it alone needs (the rest of the page reads the service's ordinary endpoints).

- ``GET /v1/dashboard/runs``                    every run with its health (the runs page)
- ``GET /v1/dashboard/runs/{run_id}``           one run's header, without the rollback answer
- ``GET /v1/runs/{run_id}/dashboard/series``    loss / grad_norm / step_time per step, downsampled
- ``GET /v1/runs/{run_id}/dashboard/heatmap``   per-rank compute time over steps, binned

Series and heatmap answers are built with numpy and written with orjson (a pydantic round trip of
100,000 heatmap cells costs more than the rest of the page), gzip-compressed when the client
accepts it; ``response_model`` still documents their shape in the OpenAPI schema.
"""
from __future__ import annotations

import gzip
from importlib import resources
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response

from healthsvc.dashboard import views
from healthsvc.dashboard.rollup import HEAT_FIELDS, LINE_FIELDS
from healthsvc.dashboard.schemas import DashboardRun, DashboardRunDetail, HeatmapOut, SeriesOut
from healthsvc.deps import RunId, SummariesDep
from healthsvc.errors import InvalidInput, NotFound

STATIC_DIR = resources.files("healthsvc.dashboard") / "static"
GZIP_ABOVE_BYTES = 2048

api = APIRouter(tags=["dashboard"])
pages = APIRouter(include_in_schema=False)


def _json(request: Request, payload: Any) -> Response:
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = {"cache-control": "no-store"}
    if len(body) > GZIP_ABOVE_BYTES and "gzip" in request.headers.get("accept-encoding", ""):
        body = gzip.compress(body, compresslevel=5)
        headers["content-encoding"] = "gzip"
    return Response(body, media_type="application/json", headers=headers)


def _hub(request: Request):
    return request.app.state.dashboard


def _require_run(request: Request, run_id: str) -> None:
    if not request.app.state.store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))


@api.get("/v1/dashboard/runs", response_model=list[DashboardRun], summary="Every run with its health (the runs page)")
def dashboard_runs(request: Request, summaries: SummariesDep) -> Response:
    return _json(request, views.runs(summaries, request.app.state.ctx.health))


@api.get("/v1/dashboard/runs/{run_id}", response_model=DashboardRunDetail,
         summary="One run's header for the run page (the rollback answer is GET .../rollback)")
def dashboard_run(run_id: RunId, request: Request, summaries: SummariesDep) -> Response:
    return _json(request, views.run_detail(summaries, request.app.state.ctx.health, _hub(request), run_id))


@api.get("/v1/runs/{run_id}/dashboard/series", response_model=SeriesOut,
         summary="Per-step cross-rank median with a per-rank min-max band, downsampled (LTTB + min-max)")
def dashboard_series(
    run_id: RunId, request: Request,
    fields: Annotated[str, Query(description="Comma-separated, from: " + ", ".join(LINE_FIELDS) + ".")] = "loss,grad_norm",
    step_min: Annotated[int | None, Query(ge=0, description="First step, inclusive (zoom).")] = None,
    step_max: Annotated[int | None, Query(ge=0, description="Last step, inclusive (zoom).")] = None,
    points: Annotated[int, Query(ge=10, le=20_000, description="Points per series at most, count.")] = 1000,
) -> Response:
    _require_run(request, run_id)
    wanted = [f for f in fields.split(",") if f]
    return _json(request, views.series(_hub(request), run_id, wanted, step_min, step_max, points))


@api.get("/v1/runs/{run_id}/dashboard/heatmap", response_model=HeatmapOut,
         summary="Per-rank compute time over steps, relative to each step's median, binned")
def dashboard_heatmap(
    run_id: RunId, request: Request,
    field: Annotated[str, Query(description="One of: " + ", ".join(HEAT_FIELDS) + ".")] = "compute_time",
    step_min: Annotated[int | None, Query(ge=0, description="First step, inclusive (zoom).")] = None,
    step_max: Annotated[int | None, Query(ge=0, description="Last step, inclusive (zoom).")] = None,
    max_cols: Annotated[int, Query(ge=1, le=4096, description="Columns (step bins) at most, count.")] = 400,
) -> Response:
    _require_run(request, run_id)
    if field not in HEAT_FIELDS:
        raise InvalidInput(f"unknown field {field!r}; the heatmap keeps {', '.join(HEAT_FIELDS)}",
                           loc=("query", "field"))
    return _json(request, views.heatmap(_hub(request), run_id, field, step_min, step_max, max_cols))


def _index() -> FileResponse:
    return FileResponse(str(STATIC_DIR / "index.html"), headers={"cache-control": "no-cache"})


@pages.get("/")
def runs_page() -> FileResponse:
    return _index()


@pages.get("/runs/{run_id}")
def run_page(run_id: RunId) -> FileResponse:
    return _index()  # one page; the script reads the run from the path
