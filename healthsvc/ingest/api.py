"""Writes from trainers: metrics, checkpoints, heartbeats, events, finish.

Each handler answers only once its write is committed (durable)."""
from __future__ import annotations

import orjson
from fastapi import APIRouter, Request, Response, status

from healthsvc.deps import RunId, SettingsDep, StoreDep
from healthsvc.limits import check_rank
from healthsvc.ingest.accept import accept_metrics
from healthsvc.ingest.committed import committed
from healthsvc.schemas import Accepted, CheckpointIn, EventIn, FinishIn, HeartbeatIn, Ok

router = APIRouter(prefix="/v1/runs/{run_id}", tags=["ingest"])

_METRICS_BODY_DOC = {
    "requestBody": {
        "required": True,
        "description": "Per-rank step records as rows or as columns. `Content-Encoding: gzip` is accepted. "
                       "Numeric fields accept numbers, NaN/Infinity/-Infinity tokens and the strings "
                       "\"NaN\", \"Infinity\", \"-Infinity\"; null or absent = not reported.",
        "content": {"application/json": {"schema": {"oneOf": [
            {"$ref": "#/components/schemas/MetricsRows"}, {"$ref": "#/components/schemas/MetricsColumnar"}]}}},
    },
}


@router.post("/metrics", status_code=status.HTTP_202_ACCEPTED, response_model=Accepted,
             openapi_extra=_METRICS_BODY_DOC,
             responses={400: {"description": "Malformed JSON or gzip."},
                        413: {"description": "Body over the configured limit."},
                        422: {"description": "A field is wrong; `detail[].loc` names it."}},
             summary="Push per-rank step metrics")
async def post_metrics(run_id: RunId, request: Request) -> Response:
    # Served by healthsvc.ingest.fast_path unless it is turned off; both run accept_metrics.
    answer = await accept_metrics(request.app.state.ctx, run_id, await request.body(),
                                  request.headers.get("content-encoding"))
    return Response(orjson.dumps(answer), status_code=202, media_type="application/json")


@router.post("/checkpoints", status_code=status.HTTP_201_CREATED, response_model=Ok,
             summary="Record a checkpoint the trainer wrote")
async def post_checkpoint(run_id: RunId, body: CheckpointIn, store: StoreDep) -> dict:
    await committed(store.control.submit_checkpoint(run_id, body.step, body.uri, body.duration_s, body.bytes))
    return {"ok": True}


@router.post("/heartbeats", status_code=status.HTTP_202_ACCEPTED, response_model=Ok,
             summary="A rank is alive; says which phase it is in")
async def post_heartbeat(run_id: RunId, body: HeartbeatIn, store: StoreDep, settings: SettingsDep) -> dict:
    check_rank(body.rank, settings.max_ranks, ("body", "rank"))
    await committed(store.control.submit_heartbeat(run_id, body.rank, body.step, body.phase))
    return {"ok": True}


@router.post("/events", status_code=status.HTTP_201_CREATED, response_model=Ok,
             summary="Record a restart, world-size change, rollback performed, or a note")
async def post_event(run_id: RunId, body: EventIn, store: StoreDep, settings: SettingsDep) -> dict:
    for key in ("old", "new"):
        if body.kind == "world_size_change":
            check_rank(body.data.get(key), settings.max_ranks, ("body", "data", key), what="world size")
    await committed(store.control.submit_event(run_id, body.kind, body.step, body.data))
    return {"ok": True}


@router.post("/finish", response_model=Ok, summary="The run, or one rank, finished: silence from then on is normal")
async def post_finish(run_id: RunId, store: StoreDep, settings: SettingsDep, body: FinishIn | None = None) -> dict:
    rank = body.rank if body is not None else None
    check_rank(rank, settings.max_ranks, ("body", "rank"))
    await committed(store.control.submit_finish(run_id, rank))
    return {"ok": True}
