"""How many runs each owner of per-run memory holds, for ``/metrics``
(``healthsvc_runs_held{holder=...}``): what the soak reads to tell state kept per run from a leak.

A finished run that had no input for ``run_release_after_s`` is let go by the monitor hub (its
detector state, its lease, and with replicas its alerts; ``healthsvc.monitor.hub``). The other
holders are counted here so that a count that only grows shows which owner keeps finished runs.
"""
from __future__ import annotations

from typing import Any, Callable


def holders(app: Any) -> dict[str, int]:
    """Runs (or run-keyed entries) held in memory now, by holder; a holder not installed is left out."""
    st = app.state
    out: dict[str, int] = {}
    monitor = getattr(st, "monitor", None)
    if monitor is not None:
        out.update({f"monitor_{k}": v for k, v in monitor.held().items()})
        out["leases"] = len(monitor.ownership.held())
    ctx = getattr(st, "ctx", None)
    if ctx is not None:
        out["findings_identities"] = ctx.findings.runs_held()
    alerting = getattr(st, "alerting", None)
    manager = getattr(alerting, "manager", None)
    if manager is not None:
        out["alerting_runs"] = manager.runs_held()
    dashboard = getattr(st, "dashboard", None)
    if dashboard is not None:
        out["dashboard_feeds"] = len(dashboard.feeds)
    store = getattr(st, "store", None)
    if store is not None:
        out["store_run_states"] = store.reads.runs_held()
    return out


class RunsHeldCollector:
    def __init__(self, app_of: Callable[[], Any]) -> None:
        self.app_of = app_of

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        g = GaugeMetricFamily("healthsvc_runs_held", "Runs held in memory, by holder.", labels=["holder"])
        for name, n in sorted(holders(self.app_of()).items()):
            g.add_metric([name], n)
        yield g
