"""``GET /v1/runs/{run_id}/action``: what a supervisor should do now. The handler is thin: the
inputs are gathered in ``service.py``, the decision is ``policy.py``'s, the answer's fields are
described in ``schemas.py``."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from healthsvc.deps import RunId
from healthsvc.supervise import service
from healthsvc.supervise.schemas import ActionOut

router = APIRouter(prefix="/v1/runs", tags=["supervise"])


@router.get("/{run_id}/action", response_model=ActionOut,
            summary="What a supervisor should do now: continue, restart (from which checkpoint, "
                    "without which hosts) or stop, and why")
def get_action(
    run_id: RunId, request: Request,
    exited: Annotated[int | None, Query(ge=-255, le=255, description=(
        "The job's exit status, when it has exited (a signal as its negative number, as Python's "
        "subprocess reports it): non-zero with no finding to explain it is a crash.")
    )] = None,
) -> dict:
    return service.decide(request.app.state.ctx, run_id, exited)
