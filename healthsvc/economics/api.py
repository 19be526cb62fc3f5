"""Run economics over HTTP: timeline, checkpoint interval advice, retention plan, goodput.

Each handler loads the run's facts (``facts.py``) and calls one pure function of
``healthsvc_detectors.offline.economics``; the response models (every field, with its unit) are in ``schemas.py``,
the formulas in docs/economics.md.
"""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from healthsvc.deps import RunId, StoreDep
from healthsvc_detectors.offline.economics.advice import MtbfPrior, advise_interval
from healthsvc_detectors.offline.economics.goodput import compute_goodput
from healthsvc_detectors.offline.economics.retention import RetentionPolicy, plan_retention
from healthsvc_detectors.offline.economics.timeline import build_timeline
from healthsvc.economics.schemas import AdviceOut, GoodputOut, RetentionOut, TimelineOut
from healthsvc.economics.service import RunFacts, fleet_failures_and_exposure, load_run_facts
from healthsvc.errors import InvalidInput, NotFound

router = APIRouter(prefix="/v1/runs", tags=["economics"])


def _facts(request: Request, store, run_id: str) -> RunFacts:
    if not store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    ctx = request.app.state.ctx
    return load_run_facts(store, ctx.findings, request.app.state.economics_cache, run_id)


def timeline_dict(facts: RunFacts, *, include_findings: bool = True, limit: int | None = None) -> dict[str, Any]:
    timeline = build_timeline(
        attempts=facts.attempts, checkpoints=facts.checkpoints, events=facts.events,
        findings=facts.findings if include_findings else (), incidents=facts.incidents,
        per_rank_batch_size=facts.per_rank_batch_size, initial_world_size=facts.configured_world_size)
    out = timeline.to_dict()
    if limit is not None and len(out["entries"]) > limit:
        out["entries"] = out["entries"][-limit:]
        out["truncated"] = True
    return out


# ``truncated`` is in the answer only when ``limit`` cut entries: exclude_unset keeps it out otherwise.
@router.get("/{run_id}/timeline", response_model=TimelineOut, response_model_exclude_unset=True,
            summary="The run's attempts, restarts, world-size changes, checkpoints, findings and "
                    "incidents in time order")
def get_timeline(
    run_id: RunId, request: Request, store: StoreDep,
    findings: Annotated[bool, Query(description="Include every stored finding as an entry (false: "
                                                "only the run's shape and incidents).")] = True,
    limit: Annotated[int | None, Query(ge=1, le=100_000, description="Only the newest this many "
                                       "entries, count; the answer then has truncated=true.")] = None,
) -> dict:
    facts = _facts(request, store, run_id)
    return {"run_id": run_id, **timeline_dict(facts, include_findings=findings, limit=limit)}


@router.get("/{run_id}/advice", response_model=AdviceOut,
            summary="Checkpoint interval advice: observed C and M, Young and Daly optima, current "
                    "interval, expected overhead, warning")
def get_advice(
    run_id: RunId, request: Request, store: StoreDep,
    prior_mtbf_s: Annotated[float | None, Query(gt=0, le=1e10, allow_inf_nan=False, description="Prior MTBF, seconds. Default: the "
                                                "organisation-wide figure from other runs, else 8 h.")] = None,
    pseudo_failures: Annotated[float, Query(gt=0, le=1e6, allow_inf_nan=False, description="Weight of the prior, in failures "
                                            "(may be fractional).")] = 2.0,
    warn_ratio: Annotated[float, Query(gt=1, le=1e6, allow_inf_nan=False, description="Warn when current/optimum interval is above "
                                       "this ratio or below its inverse, unitless.")] = 2.0,
) -> dict:
    facts = _facts(request, store, run_id)
    if prior_mtbf_s is not None:
        prior = MtbfPrior(mtbf_s=prior_mtbf_s, pseudo_failures=pseudo_failures, source="request")
    else:
        failures, exposure = fleet_failures_and_exposure(store, run_id)
        prior = MtbfPrior.from_fleet(failures, exposure, pseudo_failures=pseudo_failures)
    advice = advise_interval(checkpoints=facts.checkpoints, failures=facts.incidents,
                             exposure_s=facts.exposure_s, step_time_s=facts.step_time_s,
                             restart_costs_s=facts.restart_downtimes_s, prior=prior,
                             warn_ratio=warn_ratio)
    return {"run_id": run_id, **advice.to_dict()}


@router.get("/{run_id}/retention", response_model=RetentionOut,
            summary="Which checkpoints to keep and which may be deleted (a plan; nothing is deleted)")
def get_retention(
    run_id: RunId, request: Request, store: StoreDep,
    keep_recent: Annotated[int, Query(ge=0, le=1_000_000, description="Newest checkpoints kept densely, count.")] = 3,
    sparse_base: Annotated[float, Query(gt=1, le=1e3, allow_inf_nan=False, description="Older checkpoints: one per age bucket growing by this "
                                        "factor, unitless.")] = 2.0,
    sparse_unit_steps: Annotated[int | None, Query(gt=0, le=2**53, description="Age unit of the buckets, steps. Default: "
                                                   "median checkpoint gap.")] = None,
    max_count: Annotated[int | None, Query(ge=0, le=2**53, description="Keep at most this many checkpoints, count "
                                           "(guarantees win).")] = None,
    max_bytes: Annotated[int | None, Query(ge=0, le=2**63 - 1, description="Keep at most this much, bytes (guarantees win).")] = None,
    lag_margin_factor: Annotated[float, Query(ge=1, le=1e3, allow_inf_nan=False, description="Multiplier on the longest detection lag seen, "
                                              "unitless.")] = 1.5,
    min_lag_window_steps: Annotated[int, Query(ge=0, le=2**53, description="Smallest lag window, steps.")] = 0,
) -> dict:
    try:
        policy = RetentionPolicy(keep_recent=keep_recent, sparse_base=sparse_base,
                                 sparse_unit_steps=sparse_unit_steps, max_count=max_count,
                                 max_bytes=max_bytes, lag_margin_factor=lag_margin_factor,
                                 min_lag_window_steps=min_lag_window_steps)
    except ValueError as exc:
        raise InvalidInput(str(exc), loc=("query",)) from None
    facts = _facts(request, store, run_id)
    plan = plan_retention(facts.checkpoints, current_step=facts.current_step,
                          corruptions=facts.corruptions, policy=policy)
    return {"run_id": run_id, **plan.to_dict(),
            "corruptions": [c.to_dict() for c in facts.corruptions]}


@router.get("/{run_id}/goodput", response_model=GoodputOut,
            summary="Wall time split into productive work, checkpoint writes, restarts, "
                    "recomputation and progress lost to corruption")
def get_goodput(run_id: RunId, request: Request, store: StoreDep) -> dict:
    facts = _facts(request, store, run_id)
    goodput = compute_goodput(facts.attempts, facts.checkpoints, facts.corruptions)
    return {"run_id": run_id, **goodput.to_dict()}
