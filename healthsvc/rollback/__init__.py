"""Rollback target and active bisection over checkpoints (a feature of the service).

Adds ``GET /v1/runs/{run_id}/rollback`` and the ``/v1/runs/{run_id}/bisection`` endpoints, a
``bisections`` table (the persisted state machine of :mod:`healthsvc_detectors.offline.bisection`), and the
``healthsvc rollback`` / ``healthsvc bisect`` commands (``healthsvc.rollback.cli``). See
docs/rollback.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext
    from healthsvc.rollback.service import Pending


if TYPE_CHECKING:  # the client-only install runs ``healthsvc rollback`` without FastAPI
    from fastapi import FastAPI


def install(app: FastAPI, ctx: ServiceContext) -> None:
    from healthsvc.rollback.api import router

    app.include_router(router)
    ctx.summaries.add_contributor(lambda run_id: {"rollback": rollback_target(ctx, run_id)})


def rollback_target(ctx: ServiceContext, run_id: str, pending: Pending | None = None) -> dict | None:
    """The checkpoint to resume from, as ``{"id", "step", "uri"}``, or None (no checkpoint);
    ``pending``: findings ``(attempt, findings)`` counted as if they were stored already (the
    run's owner asks before the job that stores them)."""
    from healthsvc.rollback.service import decide

    return decide(ctx, run_id, pending).to_dict(run_id)["checkpoint"]


def incident_onset(ctx: ServiceContext, run_id: str) -> int | None:
    """The earliest step the first corrupted update may be (``onset.low`` of the rollback answer),
    or None without an estimate: what a rollback resolves latched alerts by."""
    from healthsvc.rollback.service import decide

    onset = decide(ctx, run_id).decision.onset
    return None if onset is None else int(onset.low)
