"""What the detectors found."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from detectors.finding import FINDING_KINDS
from healthsvc.deps import RunId, StoreDep
from healthsvc.errors import NotFound

router = APIRouter(prefix="/v1/runs", tags=["findings"])

Kind = Literal[FINDING_KINDS]  # type: ignore[valid-type]


class FindingOut(BaseModel):
    id: int = Field(..., description="Identifier, increasing in the order findings were stored.")
    run_id: str = Field(..., description="The run.")
    attempt: int = Field(..., description="Attempt in which it was found.")
    kind: str = Field(..., description="One of: " + ", ".join(FINDING_KINDS) + ". Also the alert name.")
    step: int = Field(..., description="First step that shows it (for resolved: the step it cleared at).")
    ranks: list[int] = Field(..., description="Ranks it blames; empty when run-wide.")
    hosts: list[str | None] = Field(..., description="Host of each blamed rank, null where unknown.")
    severity: str = Field(..., description="info | warning | critical.")
    score: float = Field(..., description="Unitless strength in [0, 1]; see the detector's docs.")
    metric: str | None = Field(None, description="The metric it was seen in, when it concerns one.")
    status: str = Field(..., description="firing = the condition started; resolved = it cleared.")
    onset_step: int | None = Field(None, description="Estimated step the problem began, when earlier than `step`.")
    evidence: dict[str, Any] = Field(..., description="The numbers behind the decision.")
    created_at: float = Field(..., description="When the service stored it, unix seconds.")


@router.get("/{run_id}/findings", response_model=list[FindingOut], summary="What the detectors found")
def list_findings(
    run_id: RunId, request: Request, store: StoreDep,
    kind: Annotated[Kind | None, Query(description="Only this kind.")] = None,
    status: Annotated[Literal["firing", "resolved"] | None, Query(description="Only this status.")] = None,
    since_step: Annotated[int | None, Query(ge=0, le=2**63 - 1, description="Only findings at or after this step.")] = None,
    since: Annotated[float | None, Query(allow_inf_nan=False, ge=-1e11, le=1e11, description="Only findings stored at or after this time, unix seconds.")] = None,
    min_severity: Annotated[Literal["info", "warning", "critical"] | None, Query(description="Lowest severity.")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000, description="At most this many, oldest first.")] = 1000,
) -> list[dict]:
    if not store.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    found = request.app.state.ctx.findings.query(run_id, kind=kind, status=status, since_step=since_step,
                                                 since=since, min_severity=min_severity, limit=limit)
    return [sf.to_dict() for sf in found]
