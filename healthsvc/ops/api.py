"""Liveness, readiness and the service's own Prometheus metrics."""
from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from healthsvc.deps import MetricsDep, StoreDep
from healthsvc.store.open import redact

router = APIRouter(tags=["ops"])


class Status(BaseModel):
    status: str = Field(..., description="ok (healthz); ready or not ready (readyz).")
    reason: str | None = Field(None, description="Why it is not ready.")
    replica: str | None = Field(None, description="readyz, replicas only: this replica's id.")
    leases: dict[str, int] | None = Field(None, description="readyz, replicas only: the runs this replica owns, "
                                                            "with the fencing token of each lease.")


@router.get("/healthz", response_model=Status, response_model_exclude_none=True, summary="The process is alive")
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", summary="The store is open and accepting writes",
            responses={200: {"model": Status}, 503: {"model": Status, "description": "Not ready: the store is not open."}})
def readyz(request: Request, store: StoreDep) -> Response:
    try:
        store.ping()
        ready = getattr(request.app.state, "ready", False)
    except Exception as exc:  # noqa: BLE001 - readiness reports any failure
        return JSONResponse({"status": "not ready", "reason": redact(str(exc)), **_leases(request)}, status_code=503)
    leases = _leases(request)
    if not ready:
        return JSONResponse({"status": "not ready", "reason": "starting or stopping", **leases}, status_code=503)
    if store.writes_failing:
        return JSONResponse({"status": "not ready", "reason": "store writes are failing (disk full or I/O error); "
                                                              "ready again after the next successful write", **leases},
                            status_code=503)
    return JSONResponse({"status": "ready", **leases})


def _leases(request: Request) -> dict:
    """A replica's id and the runs it acts on now (after the ping, which may wait), said even when
    not ready: one cut off from the database shows it has let its leases go."""
    return request.app.state.ctx.ownership.readiness()


@router.get("/metrics", summary="Prometheus exposition of the service itself",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def prometheus(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
