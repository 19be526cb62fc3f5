"""The dashboard (a feature): every run at a glance at ``/``, a run's whole story at
``/runs/{run_id}``, served by the service itself from assets shipped in this package.

The pages are static HTML + JavaScript (``static/``; uPlot vendored in ``static/vendor/``, see its
README) that read the service's JSON endpoints. For the curves and the heatmap it keeps a small
per-run rollup (``rollup.py``), maintained from committed ingest by :class:`~.hub.RollupHub`, so the
page of a 16,384-rank x 10,000-step run costs the same to open as that of an 8-rank one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


def install(app: FastAPI, ctx: ServiceContext) -> None:
    from fastapi.staticfiles import StaticFiles

    from healthsvc.dashboard.hub import RollupHub
    from healthsvc.dashboard.api import STATIC_DIR, api, pages

    hub = RollupHub(ctx.store, clock=ctx.clock, align_timeout_s=ctx.settings.align_timeout_s,
                    tick_interval_s=ctx.settings.tick_interval_s)
    app.state.dashboard = ctx.dashboard = hub
    ctx.on_startup.append(hub.start)
    ctx.on_shutdown.append(hub.stop)
    app.include_router(api)
    app.include_router(pages)
    app.mount("/dashboard/static", StaticFiles(directory=str(STATIC_DIR)), name="dashboard-static")
