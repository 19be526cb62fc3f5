"""Live detection inside the service: per-run monitors fed by committed ingest (a feature).

Installs the monitor hub (see ``hub.py``), validates detector parameters of ``PUT /v1/runs``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext
    from healthsvc.monitor.hub import MonitorHub


def install(app: FastAPI, ctx: ServiceContext) -> None:
    from healthsvc.monitor.hub import MonitorHub

    settings = ctx.settings
    if not settings.detect:
        return
    hub = MonitorHub(ctx.store, ctx.findings, clock=ctx.clock, tick_interval_s=settings.tick_interval_s,
                     snapshot_every_s=settings.snapshot_every_s, align_timeout_s=settings.align_timeout_s,
                     ownership=ctx.ownership, release_after_s=settings.run_release_after_s,
                     alerts=ctx.alerting)   # the run's owner owns its alerts (hub.RunAlerts)
    app.state.monitor = ctx.monitor = hub
    # A run whose stored config was refused at start says so in its summary (GET /v1/runs/{id}).
    ctx.summaries.add_contributor(lambda run_id: {"config_error": hub.config_errors.get(run_id)})
    ctx.metrics.registry.register(LagCollector(hub))
    ctx.on_startup.append(hub.start)
    ctx.on_shutdown.append(hub.stop)


class LagCollector:
    """Prometheus, at scrape time: how far behind its input the run's owner judges."""

    def __init__(self, hub: "MonitorHub") -> None:
        self.hub = hub

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(
            "healthsvc_monitor_lag_seconds",
            "Seconds from the arrival of the last input the detectors judged to their judging it: about 0 live, "
            "the age of the data after a restart's or a takeover's replay, growing when the monitor falls behind.",
            value=self.hub.lag_s)
