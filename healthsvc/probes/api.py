"""Replay probes over HTTP; handlers are thin (``service.py``), models in ``schemas.py``.

- ``POST /v1/runs/{run_id}/probes``                      ask for a probe of a suspect rank
- ``GET  /v1/runs/{run_id}/probes``                      every probe of the run, oldest first
- ``GET  /v1/runs/{run_id}/probes/next?after=N&upto_step=S``  the oldest pending probe after id N
  whose step the trainer has reached (204: none)
- ``GET  /v1/runs/{run_id}/probes/{probe_id}``           one probe and its verdict
- ``POST /v1/runs/{run_id}/probes/{probe_id}/reports``   one rank's recomputed gradient norm
"""
from __future__ import annotations

from typing import Annotated, TYPE_CHECKING

from fastapi import APIRouter, Path, Query, Request, Response

from healthsvc.deps import RunId
from healthsvc.errors import NotFound
from healthsvc.limits import INT64_MAX
from healthsvc.probes import service
from healthsvc.probes.schemas import Probe, ProbeIn, ProbeReportIn

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


router = APIRouter(prefix="/v1/runs", tags=["probes"])
ProbeId = Annotated[int, Path(ge=0, le=INT64_MAX, description="The probe's id.")]


def _ctx(request: Request):
    return request.app.state.ctx


def _require_run(ctx: ServiceContext, run_id: str) -> None:
    if not ctx.store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))


@router.post("/{run_id}/probes", status_code=201, response_model=Probe,
             summary="Ask for a replay probe of a suspect rank")
def post_probe(run_id: RunId, body: ProbeIn, request: Request) -> dict:
    return service.request_probe(_ctx(request), run_id, body.suspect_rank, body.healthy_rank,
                                 body.step, body.finding_id, body.reason)


@router.get("/{run_id}/probes", response_model=list[Probe], summary="The run's replay probes")
def get_probes(run_id: RunId, request: Request) -> list[dict]:
    _require_run(_ctx(request), run_id)
    return service.list_probes(_ctx(request), run_id)


@router.get("/{run_id}/probes/next", response_model=Probe,
            responses={204: {"description": "No pending probe after `after`."}},
            summary="The next probe for the trainer to run (polled)")
def get_next_probe(run_id: RunId, request: Request, after: Annotated[int, Query(
        ge=0, le=INT64_MAX, description="The newest probe id the trainer has taken already (0: none).")] = 0,
        upto_step: Annotated[int | None, Query(ge=0, le=INT64_MAX, description=(
            "The trainer's current step: only probes of steps it has reached (their batch exists "
            "and the state to probe is the one after it). Default: any step."))] = None):
    _require_run(_ctx(request), run_id)
    probe = service.next_probe(_ctx(request), run_id, after, upto_step)
    return Response(status_code=204) if probe is None else probe


@router.get("/{run_id}/probes/{probe_id}", response_model=Probe, summary="One probe and its verdict")
def get_probe(run_id: RunId, probe_id: ProbeId, request: Request) -> dict:
    _require_run(_ctx(request), run_id)
    return service.get_probe(_ctx(request), run_id, probe_id)


@router.post("/{run_id}/probes/{probe_id}/reports", response_model=Probe,
             summary="Report one rank's recomputed gradient norm")
def post_report(run_id: RunId, probe_id: ProbeId, body: ProbeReportIn, request: Request) -> dict:
    _require_run(_ctx(request), run_id)
    return service.report(_ctx(request), run_id, probe_id, body.rank, body.grad_norm)
