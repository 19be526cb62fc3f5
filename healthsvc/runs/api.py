"""Runs, their history, checkpoints and events, for people, notebooks and restart scripts."""
from __future__ import annotations

from typing import Annotated, Literal, TypedDict

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response, StreamingResponse

from healthsvc import encode, export
from healthsvc.deps import RunId, SettingsDep, StoreDep, SummariesDep
from healthsvc.detector_config import probe_suite
from healthsvc.limits import INT64_MAX, check_rank
from healthsvc.errors import InvalidInput, NotFound
from healthsvc.monitor.suite import build_suite
from healthsvc.history import iter_history_batches, load_history
from healthsvc.schemas import Checkpoint, CheckpointStatusIn, Event, Heartbeat, Ok, RunConfig, RunSummary
from healthsvc.ingest.committed import committed

router = APIRouter(prefix="/v1/runs", tags=["runs"])


@router.get("", response_model=list[RunSummary], summary="All runs and their health at a glance")
def list_runs(summaries: SummariesDep) -> list[dict]:
    return summaries.list()


@router.put("/{run_id}", response_model=RunSummary, summary="Create a run or change its config")
async def put_run(run_id: RunId, config: RunConfig, store: StoreDep, summaries: SummariesDep,
                  settings: SettingsDep) -> dict:
    check_rank(config.world_size, settings.max_ranks, ("body", "world_size"), what="world size")
    # A bad detector parameter is a 422 now, not a monitor failing on every push later: types and
    # ranges first, then a probe block through each detector (healthsvc.detector_config).
    probe_suite(build_suite(config.model_dump()))
    await committed(store.control.submit_run_config(run_id, config.model_dump()))
    return summaries.summary(run_id)


@router.get("/{run_id}", response_model=RunSummary, summary="One run: status, attempts, world size, ranks, findings")
def get_run(run_id: RunId, summaries: SummariesDep) -> dict:
    return summaries.summary(run_id)



class _HistoryFilters(TypedDict):
    """The keyword filters of :func:`iter_history_batches` (and :func:`load_history`)."""
    step_min: int | None
    step_max: int | None
    ranks: set[int] | None
    fields: set[str]
    attempt: int | None


def _parse_int_list(text: str | None, name: str) -> set[int] | None:
    if text is None or text == "":
        return None
    try:
        out = {int(x) for x in text.split(",") if x.strip() != ""}
    except ValueError:
        raise InvalidInput(f"{name} must be comma-separated integers, e.g. 0,1,7", loc=("query", name)) from None
    if any(x < 0 or x > INT64_MAX for x in out):
        raise InvalidInput(f"{name} must be integers from 0 to 2**63-1", loc=("query", name))
    return out


@router.get("/{run_id}/metrics", summary="A run's history (JSON columns or streamed CSV)",
            responses={200: {"content": {"text/csv": {}, "application/vnd.apache.arrow.stream": {}}, "description":
                             "JSON: {run_id, n, fields, columns: {step, rank, attempt, [host], <field>...}}, "
                             "rows sorted by (step, rank); non-finite values as \"NaN\"/\"Infinity\"/\"-Infinity\", "
                             "missing as null. CSV and Arrow: same columns, streamed in arrival order; CSV writes nan/inf/-inf and "
                             "a missing value as an empty field; Arrow keeps missing as null and NaN as NaN."}})
def get_metrics(
    run_id: RunId, store: StoreDep,
    step_min: Annotated[int | None, Query(ge=0, le=INT64_MAX, description="First step, inclusive.")] = None,
    step_max: Annotated[int | None, Query(ge=0, le=INT64_MAX, description="Last step, inclusive.")] = None,
    ranks: Annotated[str | None, Query(description="Comma-separated ranks, e.g. 0,3,7. Default: all.")] = None,
    fields: Annotated[str | None, Query(description="Comma-separated metric fields. Default: all.")] = None,
    attempt: Annotated[int | None, Query(ge=1, le=INT64_MAX, description="Only this attempt. Default: the effective history "
                                                         "(newest attempt wins for each step).")] = None,
    format: Annotated[Literal["json", "csv", "arrow"], Query(
        description="json, csv, or arrow (an Apache Arrow IPC stream: nulls are missing, NaN is NaN).")] = "json",
) -> Response:
    if not store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    rank_set = _parse_int_list(ranks, "ranks")
    known_fields, has_hosts = store.reads.fields(run_id)
    if fields:
        wanted = list(dict.fromkeys(f for f in fields.split(",") if f))   # a field named twice is one column
        unknown = [f for f in wanted if f not in known_fields]
        if unknown:
            raise InvalidInput(f"unknown field {unknown[0]!r}; this run has: {', '.join(known_fields) or 'none'}",
                               loc=("query", "fields"))
    else:
        wanted = known_fields
    filters = _HistoryFilters(step_min=step_min, step_max=step_max, ranks=rank_set, fields=set(wanted), attempt=attempt)
    if format in ("csv", "arrow"):
        schema = export.arrow_schema(wanted, has_hosts)
        media = "text/csv" if format == "csv" else export.ARROW_MEDIA_TYPE
        return StreamingResponse(export.stream(format, schema, iter_history_batches(store, run_id, **filters)),
                                 media_type=media,
                                 headers={"content-disposition": f'attachment; filename="{run_id}.{format}"'})
    hist = load_history(store, run_id, **filters)
    columns: dict[str, list] = {"step": hist.steps.tolist(), "rank": hist.ranks.tolist(),
                                "attempt": hist.attempts.tolist()}
    if has_hosts:
        columns["host"] = hist.hosts or [None] * len(hist)
    for f in wanted:
        if f in hist.labels:
            columns[f] = hist.labels[f]
        elif f in hist.values:
            columns[f] = encode.float_column_to_json(hist.values[f], hist.present[f])
        else:
            columns[f] = [None] * len(hist)
    return Response(encode.dumps({"run_id": run_id, "n": len(hist), "fields": wanted, "columns": columns}),
                    media_type="application/json")


@router.get("/{run_id}/checkpoints", response_model=list[Checkpoint], summary="Checkpoints the trainer reported")
def list_checkpoints(run_id: RunId, store: StoreDep) -> list[dict]:
    if not store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    return store.reads.checkpoints(run_id)


@router.patch("/{run_id}/checkpoints/{checkpoint_id}", response_model=Ok,
              summary="Mark a checkpoint verified, bad or deleted")
async def patch_checkpoint(run_id: RunId, body: CheckpointStatusIn, store: StoreDep,
                           checkpoint_id: Annotated[int, Path(ge=0, le=INT64_MAX, description="The checkpoint's id (from GET .../checkpoints).")]) -> dict:
    changed = await committed(store.control.submit_checkpoint_status(run_id, checkpoint_id, body.status, body.note))
    if not changed:
        raise NotFound(f"run {run_id!r} has no checkpoint {checkpoint_id}", loc=("path", "checkpoint_id"))
    return {"ok": True}


@router.get("/{run_id}/events", response_model=list[Event], summary="Restarts, world-size changes, rollbacks, notes")
def list_events(run_id: RunId, store: StoreDep) -> list[dict]:
    if not store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    return store.reads.events(run_id)


@router.get("/{run_id}/heartbeats", response_model=list[Heartbeat],
            summary="Each rank's latest heartbeat: step, phase, time")
def list_heartbeats(run_id: RunId, store: StoreDep) -> list[dict]:
    if not store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    return store.reads.heartbeats(run_id)
