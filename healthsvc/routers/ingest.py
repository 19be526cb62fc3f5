"""Writes from trainers: metrics, checkpoints, heartbeats, events, finish.

Each handler answers only once its write is committed (durable)."""
from __future__ import annotations

import asyncio
import time

import orjson
from fastapi import APIRouter, Request, Response, status

from healthsvc.deps import MetricsDep, RunId, SettingsDep, StoreDep
from healthsvc.errors import HealthsvcError
from healthsvc.ingest.parse import decode_body, parse_metrics
from healthsvc.schemas import Accepted, CheckpointIn, EventIn, HeartbeatIn, MetricsColumnar, MetricsRows, Ok

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
    # The hot path: no dependency injection or response-model validation (they cost more than
    # parsing a small batch); the context comes straight from the app.
    ctx = request.app.state.ctx
    store, metrics = ctx.store, ctx.metrics
    started = time.perf_counter()
    try:
        raw = await request.body()
        body = decode_body(raw, request.headers.get("content-encoding"), ctx.settings.max_body_bytes)
        batch, digest = parse_metrics(body)
    except HealthsvcError:
        metrics.ingest_requests.labels("rejected").inc()
        raise
    result = await asyncio.wrap_future(store.submit_metrics(run_id, batch, digest))
    if result.duplicate:
        metrics.ingest_duplicates.inc()
        metrics.ingest_requests.labels("duplicate").inc()
    else:
        metrics.ingest_requests.labels("accepted").inc()
        metrics.ingest_records.inc(result.accepted)
        metrics.ingest_points.inc(batch.n_points)
    metrics.ingest_latency.observe(time.perf_counter() - started)
    return Response(orjson.dumps({"accepted": result.accepted, "duplicate": result.duplicate,
                                  "attempt": result.attempt}), status_code=202, media_type="application/json")


@router.post("/checkpoints", status_code=status.HTTP_201_CREATED, response_model=Ok,
             summary="Record a checkpoint the trainer wrote")
async def post_checkpoint(run_id: RunId, body: CheckpointIn, store: StoreDep) -> dict:
    await asyncio.wrap_future(store.submit_checkpoint(run_id, body.step, body.uri, body.duration_s, body.bytes))
    return {"ok": True}


@router.post("/heartbeats", status_code=status.HTTP_202_ACCEPTED, response_model=Ok,
             summary="A rank is alive; says which phase it is in")
async def post_heartbeat(run_id: RunId, body: HeartbeatIn, store: StoreDep) -> dict:
    await asyncio.wrap_future(store.submit_heartbeat(run_id, body.rank, body.step, body.phase))
    return {"ok": True}


@router.post("/events", status_code=status.HTTP_201_CREATED, response_model=Ok,
             summary="Record a restart, world-size change, rollback performed, or a note")
async def post_event(run_id: RunId, body: EventIn, store: StoreDep) -> dict:
    await asyncio.wrap_future(store.submit_event(run_id, body.kind, body.step, body.data))
    return {"ok": True}


@router.post("/finish", response_model=Ok, summary="The run finished: silence from now on is normal")
async def post_finish(run_id: RunId, store: StoreDep) -> dict:
    await asyncio.wrap_future(store.submit_finish(run_id))
    return {"ok": True}
