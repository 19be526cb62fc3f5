"""Rollback target and active bisection over HTTP. Handlers are thin: see ``service.py``; the
request and response models (fields, units) are in ``schemas.py``.

- ``GET  /v1/runs/{run_id}/rollback``             where to resume from, and why
- ``POST /v1/runs/{run_id}/bisection``            start (or restart) a bisection over checkpoints
- ``GET  /v1/runs/{run_id}/bisection``            its state: next probe, last good, first bad
- ``POST /v1/runs/{run_id}/bisection/reports``    a probe's verdict (409 when it contradicts)
- ``DELETE /v1/runs/{run_id}/bisection``          abandon it (probe verdicts stay on checkpoints)
"""
from __future__ import annotations

from fastapi import APIRouter, Request

from healthsvc.deps import RunId, StoreDep
from healthsvc.errors import NotFound
from healthsvc.rollback import service
from healthsvc.rollback.schemas import (BisectionDeleted, BisectionOut, BisectionStartIn,
                                        ProbeReportIn, RollbackOut)

router = APIRouter(prefix="/v1/runs", tags=["rollback"])


def _ctx(request: Request):
    return request.app.state.ctx


def _require_run(store, run_id: str) -> None:
    if not store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))


def _status(store, run_id: str, b) -> dict:
    _, ids, _ = service.stored_checkpoints(store, run_id)
    uris = {int(r["step"]): r["uri"] for r in store.reads.checkpoints(run_id)}
    return {"run_id": run_id, **service.bisection_status(b, ids, uris)}


@router.get("/{run_id}/rollback", response_model=RollbackOut,
            summary="The checkpoint to resume from, the onset estimate, the findings it rests on, "
                    "and the reason")
def get_rollback(run_id: RunId, request: Request) -> dict:
    return service.decide(_ctx(request), run_id).to_dict(run_id)


@router.post("/{run_id}/bisection", status_code=201, response_model=BisectionOut,
             summary="Start a bisection over checkpoints")
def start_bisection(run_id: RunId, body: BisectionStartIn, request: Request, store: StoreDep) -> dict:
    _require_run(store, run_id)
    b, ids, uris = service.start_bisection(_ctx(request), run_id, body.steps, body.known_good,
                                           body.known_bad)
    return {"run_id": run_id, **service.bisection_status(b, ids, uris)}


@router.get("/{run_id}/bisection", response_model=BisectionOut,
            summary="The bisection's state and the next checkpoint to probe")
def get_bisection(run_id: RunId, store: StoreDep) -> dict:
    _require_run(store, run_id)
    b = service.load_bisection(store, run_id)
    if b is None:
        raise NotFound(f"run {run_id!r} has no bisection", loc=("path", "run_id"),
                       hint="start one with POST /v1/runs/{run_id}/bisection")
    return _status(store, run_id, b)


@router.post("/{run_id}/bisection/reports", response_model=BisectionOut,
             summary="Report a probe: good or bad, with an optional value")
def report_probe(run_id: RunId, body: ProbeReportIn, request: Request, store: StoreDep) -> dict:
    _require_run(store, run_id)
    _, ids, _ = service.stored_checkpoints(store, run_id)
    b = service.report_probe(_ctx(request), run_id, body.step, body.good, body.value, ids)
    return _status(store, run_id, b)


@router.delete("/{run_id}/bisection", response_model=BisectionDeleted,
               summary="Abandon the bisection (checkpoint verdicts stay)")
def delete_bisection(run_id: RunId, store: StoreDep) -> dict:
    _require_run(store, run_id)
    if not store.bisections.submit_delete(run_id).result():
        raise NotFound(f"run {run_id!r} has no bisection", loc=("path", "run_id"))
    return {"ok": True}
