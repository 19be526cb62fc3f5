"""What every feature builds on: the context ``healthsvc.app.create_app`` makes and hands to each
feature's ``install(app, ctx)`` (and, through ``app.state.ctx``, to its handlers).

Typed, so a feature's use of it is checked: the services are built once, in the factory, and a
feature reads them from here rather than from module globals.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from healthsvc.ownership import RunOwnership, SoleOwner

if TYPE_CHECKING:  # pragma: no cover - the services import features that import this module
    from healthsvc.alerting.service import AlertingService
    from healthsvc.dashboard.hub import RollupHub
    from healthsvc.monitor.hub import MonitorHub
    from healthsvc.findings import FindingsService
    from healthsvc.health import RunHealth
    from healthsvc.observability import ServiceMetrics
    from healthsvc.runs import RunSummaries
    from healthsvc.settings import Settings
    from healthsvc.store.interface import Store

Hook = Callable[[], Any | Awaitable[Any]]

@dataclass
class ServiceContext:
    """What a feature gets to build on."""
    settings: Settings
    store: Store
    metrics: ServiceMetrics
    summaries: RunSummaries
    findings: FindingsService
    health: RunHealth               # what is firing (findings and their alerts' state)
    alerting: AlertingService
    ownership: RunOwnership = field(default_factory=SoleOwner)
    clock: Callable[[], float] = time.time
    on_startup: list[Hook] = field(default_factory=list)   # run after the store opens, in order
    on_shutdown: list[Hook] = field(default_factory=list)  # run before the store closes, in reverse
    # The pipeline's stages a feature installs (``healthsvc.pipeline.build`` lists them in order).
    monitor: MonitorHub | None = None
    dashboard: RollupHub | None = None
    run_series: Any = None                                  # per-run Prometheus series fed by commits
    auto_probe: Callable[[list], None] | None = None        # asks for replay probes of new findings
