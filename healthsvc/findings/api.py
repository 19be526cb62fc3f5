"""What the detectors found."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from healthsvc_detectors import kinds as kind_table
from healthsvc_detectors.registry import FINDING_KINDS
from healthsvc.deps import RunId, StoreDep
from healthsvc.errors import InvalidInput, NotFound

router = APIRouter(prefix="/v1/runs", tags=["findings"])
kinds_router = APIRouter(prefix="/v1", tags=["findings"])

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
    observed_at: float | None = Field(
        None, description="When the input that raised it (a push, a heartbeat, a finish) reached the service, unix "
                          "seconds; null when not known (found by a timer, e.g. a hang, or stored before this field). "
                          "`created_at - observed_at` is how long detection took; its alert is timed by it.")


@router.get("/{run_id}/findings", response_model=list[FindingOut], summary="What the detectors found")
def list_findings(
    run_id: RunId, request: Request, store: StoreDep,
    kind: Annotated[str | None, Query(max_length=64, description="Only this kind (GET /v1/kinds lists them).")] = None,
    status: Annotated[Literal["firing", "resolved"] | None, Query(description="Only this status.")] = None,
    since_step: Annotated[int | None, Query(ge=0, le=2**63 - 1, description="Only findings at or after this step.")] = None,
    since: Annotated[float | None, Query(allow_inf_nan=False, ge=-1e11, le=1e11, description="Only findings stored at or after this time, unix seconds.")] = None,
    min_severity: Annotated[Literal["info", "warning", "critical"] | None, Query(description="Lowest severity.")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000, description="At most this many, oldest first.")] = 1000,
) -> list[dict]:
    if kind is not None and not kind_table.known(kind):
        raise InvalidInput(f"unknown kind {kind!r}; expected one of {', '.join(kind_table.names())}",
                           loc=("query", "kind"))
    if not store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    found = request.app.state.ctx.findings.query(run_id, kind=kind, status=status, since_step=since_step,
                                                 since=since, min_severity=min_severity, limit=limit)
    return [sf.to_dict() for sf in found]


class KindOut(BaseModel):
    """What a finding kind means, as its detector declares it (``detectors/kinds.py``)."""

    name: str = Field(..., description="The kind: the finding's `kind` and the alert's `alertname`.")
    meaning: str = Field(..., description="What it means, in one line.")
    resolves: Literal["condition", "latched", "explicit"] = Field(
        ..., description="How its alert resolves: condition = once the condition stays clear for the resolve "
                         "timeout; latched = only by hand or by a rollback; explicit = only on the detector's "
                         "own resolved finding (hang, stall).")
    mutes: list[str] = Field(..., description="Kinds whose alerts of the same run it inhibits while it fires.")
    corruption: Literal["abrupt", "drift"] | None = Field(
        ..., description="null: says nothing about the weights. Otherwise rollback evidence, its onset searched "
                         "for in the abrupt window (a few dozen steps) or the drift one (a few hundred).")
    heals: bool = Field(..., description="Whether an episode that recovered quickly may be dismissed as a transient.")
    onset_guessed: bool = Field(..., description="Its onset step is a guess; only its detection step bounds the onset.")
    probe: bool = Field(..., description="A warning or critical finding asks for a replay probe of the rank it names.")
    incident: Literal["stall", "non_finite", "corruption"] | None = Field(
        ..., description="What it is to the run's economics (MTBF, goodput), or null.")
    restarts_at: Literal["info", "warning", "critical"] | None = Field(
        ..., description="The lowest severity at which a supervisor restarts the run for it by default "
                         "(GET /v1/runs/{run_id}/action), or null: left to people.")
    blames_host: bool = Field(..., description="The ranks it names point at their machine: a restart leaves those hosts out.")
    label: str = Field(..., description="How pages and plots name it.")
    colour: str = Field(..., description="How pages and plots draw it (a CSS colour).")


@kinds_router.get("/kinds", response_model=list[KindOut], summary="What each finding kind means")
def list_kinds() -> list[dict]:
    return [{**k.__dict__, "mutes": sorted(k.mutes)} for k in kind_table.kinds()]
