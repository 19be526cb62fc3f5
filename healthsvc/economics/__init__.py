"""Run economics in the service (a feature): timeline, interval advice, retention plan, goodput.

Adds ``GET /v1/runs/{run_id}/timeline|advice|retention|goodput`` (``api``, ``schemas``) and a
compact ``timeline`` section to ``GET /v1/runs/{run_id}``; ``service`` gathers a run's facts from
the store. The maths is in :mod:`healthsvc_detectors.offline.economics` (pure).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import logging

from fastapi import FastAPI

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


log = logging.getLogger(__name__)

SUMMARY_TIMELINE_ENTRIES = 50  # the run summary shows the newest entries; /timeline has them all


def install(app: FastAPI, ctx: ServiceContext) -> None:
    from healthsvc.economics.service import AttemptStatsCache, load_run_facts
    from healthsvc.economics.api import router, timeline_dict

    cache = AttemptStatsCache(ctx.store)
    app.state.economics_cache = cache
    app.include_router(router)

    def timeline_section(run_id: str) -> dict:
        facts = load_run_facts(ctx.store, ctx.findings, cache, run_id)
        # Findings are listed in the summary's own section; the timeline here shows the run's shape.
        return {"timeline": timeline_dict(facts, include_findings=False, limit=SUMMARY_TIMELINE_ENTRIES)}

    ctx.summaries.add_contributor(timeline_section)
