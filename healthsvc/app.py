"""The app factory: settings in, a FastAPI app out. Nothing is opened at import time.

The services every feature builds on (store, findings, run health, alerting) are constructed
here, in the order their dependencies dictate; then each feature (detection, economics,
alerting, rollback, dashboard, run metrics) is installed by a plain call to its
``install(app, ctx, ...)``, which includes its router and registers start/stop hooks and summary
contributors, and puts its pipeline stage on ``ctx``; then :func:`healthsvc.pipeline.build`
lists the stages in order (the store's one after-commit listener). Start hooks run in
installation order, stop hooks in reverse.
"""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from healthsvc import dashboard, economics, monitor, pipeline, probes, rollback, run_metrics, supervise
from healthsvc.alerting import service as alerting_feature
from healthsvc.alerting.service import AlertingService
from healthsvc.auth.guard import Guard
from healthsvc.auth.api import router as auth_router
from healthsvc.auth.hosts import HostPolicy, is_loopback
from healthsvc.auth.tokens import TokenStore
from healthsvc.body_limit import BodyLimitMiddleware
from healthsvc.clock import ServiceClock
from healthsvc.context import Hook, ServiceContext
from healthsvc.errors import HealthsvcError, quota_error, store_error
from healthsvc.findings import FindingsService
from healthsvc.findings import api as findings_api
from healthsvc.head import HeadAsGet
from healthsvc.health import RunHealth
from healthsvc.ingest import api as ingest_api
from healthsvc.ingest.fast_path import IngestFastPath
from healthsvc.ownership import LeasesCollector, ownership_for
from healthsvc.observability import ServiceMetrics
from healthsvc.ops import allocator
from healthsvc.ops import api as ops_api
from healthsvc.runs import api as runs_api
from healthsvc.runs import RunSummaries
from healthsvc.schemas import ErrorBody, ErrorItem, MetricsColumnar, MetricsRows
from healthsvc.settings import Settings
from healthsvc.store.outbox import Outbox
from healthsvc.store.errors import STORE_ERRORS
from healthsvc.store.open import open_store, redact
from healthsvc.store.quotas import QuotaExceeded, Quotas

log = logging.getLogger("healthsvc")

async def _call(hook: Hook) -> None:
    result = hook()
    if hasattr(result, "__await__"):
        await result


def create_app(settings: Settings | None = None, *, clock: Callable[[], float] | None = None) -> FastAPI:
    """``clock``: unix seconds for every timeout, interval and stored time; by default a
    :class:`~healthsvc.clock.ServiceClock` (immune to steps of the system clock)."""
    settings = settings or Settings()
    clock = clock or ServiceClock()
    store = open_store(settings.db, snapshot_every_s=settings.snapshot_every_s,
                        dedupe_window_s=settings.dedupe_window_s, clock=clock,
                        quotas=Quotas(max_runs=settings.max_runs, max_runs_per_token=settings.max_runs_per_token,
                                      max_metric_names=settings.max_metric_names))
    metrics = ServiceMetrics(store.size_bytes)
    findings = FindingsService(store, clock)
    ownership = ownership_for(settings, store)   # which runs this replica watches (replicas)
    # Alerting's rollback annotation asks the rollback feature, which reads through ``ctx``
    # (bound below; the lookup is called only once the service runs).
    alerting = AlertingService(Outbox(store), settings, clock,
                               rollback_lookup=lambda run_id, pending=None: rollback.rollback_target(ctx, run_id, pending),
                               onset_lookup=lambda run_id: rollback.incident_onset(ctx, run_id),
                               ownership=ownership)
    ctx = ServiceContext(settings=settings, store=store, metrics=metrics, summaries=RunSummaries(store),
                         findings=findings, health=RunHealth(findings, alerting.alert_states),
                         alerting=alerting, ownership=ownership, clock=clock)

    tokens = TokenStore(store, clock, admin_token=settings.admin_token, exposed=not is_loopback(settings.host))
    metrics.registry.register(LeasesCollector(ownership))
    trimmer = allocator.Trimmer(settings.malloc_trim_every_s, grown_bytes=int(settings.malloc_trim_grown_mib * 2**20))
    metrics.registry.register(allocator.AllocatorCollector(trimmer))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        store.open()
        _start_clock_after_stored_times(clock, store)
        tokens.load()
        _check_exposure(settings, tokens)
        for hook in ctx.on_startup:
            await _call(hook)
        trimmer.start()
        app.state.ready = True
        log.info("healthsvc ready on store %s", store.path)
        try:
            yield
        finally:
            app.state.ready = False
            for hook in reversed(ctx.on_shutdown):
                try:
                    await _call(hook)
                except Exception:
                    log.exception("shutdown hook %r failed", hook)
            store.close()
            trimmer.stop()

    app = FastAPI(
        title="healthsvc",
        version="1.0.0",
        summary="Training-run health: NaNs, spikes, stragglers, hangs, silent corruption, and where to roll back to.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.metrics = metrics
    app.state.summaries = ctx.summaries
    app.state.ctx = ctx
    app.state.tokens = tokens
    app.state.ready = False
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(HeadAsGet)
    _install_error_handlers(app)
    app.include_router(ingest_api.router)
    app.include_router(runs_api.router)
    app.include_router(findings_api.router)
    app.include_router(findings_api.kinds_router)
    app.include_router(ops_api.router)
    app.include_router(auth_router)
    ctx.summaries.add_contributor(ctx.health.summary)
    # Alerting starts before the monitor, whose first restore records findings (folded into
    # alerts as they are recorded), and stops after it.
    alerting_feature.install(app, ctx)
    monitor.install(app, ctx)
    economics.install(app, ctx)
    rollback.install(app, ctx)
    probes.install(app, ctx)
    supervise.install(app, ctx)
    dashboard.install(app, ctx)
    run_metrics.install(app, ctx)
    app.state.pipeline = pipeline.build(ctx)   # the stages a commit feeds, in order; drain() is its
    from healthsvc.runs.held import RunsHeldCollector
    ctx.metrics.registry.register(RunsHeldCollector(lambda: app))
    _install_openapi(app)
    return app


def _start_clock_after_stored_times(clock: Callable[[], float], store: Any) -> None:
    """Stored times are compared with the service clock (a rank's last push with now): after a
    restart with the wall clock behind them, the clock starts from the newest of them instead
    (see ``healthsvc.clock``), so the offset delays no timeout. Clocks without ``not_before``
    (a test's fake clock) are left alone."""
    not_before = getattr(clock, "not_before", None)
    if not_before is None:
        return
    shift = not_before(store.reads.newest_time())
    if shift > 0:
        log.warning("the wall clock is %.1f s behind the newest time the store holds; the service clock "
                    "starts from that time (timeouts are measured from it; stored times may run ahead of "
                    "the wall clock by as much)", shift)


def create_asgi(settings: Settings | None = None, *, clock: Callable[[], float] | None = None):
    """What ``healthsvc serve`` runs: the app, behind the ingest fast path unless it is off.

    The fast path wraps the whole FastAPI app (framework middleware included) so a metrics push
    costs no framework work at all; everything else goes through to FastAPI unchanged."""
    app = create_app(settings, clock=clock)
    settings = app.state.settings
    inner = IngestFastPath(app, app.state.ctx) if settings.ingest_fast_path else app
    # The guard (Host, Content-Type, tokens, audit) is outermost: the fast path is behind it too.
    hosts = HostPolicy.for_listener(settings.host, extra=settings.allowed_hosts, external_url=settings.external_url)
    return Guard(inner, app.state.tokens, hosts=hosts)


def _check_exposure(settings: Settings, tokens: TokenStore) -> None:
    """Without any token the service is open: say so loudly, and refuse a non-loopback address
    unless the operator insists (--insecure)."""
    if tokens.enabled:
        return
    if not is_loopback(settings.host) and not settings.insecure:
        raise RuntimeError(
            f"refusing to listen on {settings.host} with no token configured: anyone who can reach it could "
            "silence alerts, change configs and delete webhooks. Set HEALTHSVC_ADMIN_TOKEN (then create tokens "
            "with POST /v1/tokens), or pass --insecure to serve it open anyway.")
    log.warning("healthsvc is OPEN: no token is configured, so anyone who can reach %s:%s can push, read and "
                "administer everything. Set HEALTHSVC_ADMIN_TOKEN to require tokens (README: Security).",
                settings.host, settings.port)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HealthsvcError)
    async def _domain_error(request: Request, exc: HealthsvcError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail()}, status_code=exc.status_code)

    async def _store_error(request: Request, exc: Exception) -> JSONResponse:
        err = store_error(exc)
        log.error("store error on %s %s: %s", request.method, request.url.path, redact(str(exc)))
        return JSONResponse({"detail": err.detail()}, status_code=err.status_code)

    for error_class in STORE_ERRORS:   # sqlite3's, and psycopg's when installed
        app.add_exception_handler(error_class, _store_error)

    @app.exception_handler(QuotaExceeded)   # a write that would make a run too many
    async def _quota_error(request: Request, exc: QuotaExceeded) -> JSONResponse:
        err = quota_error(exc)
        return JSONResponse({"detail": err.detail()}, status_code=err.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default answer, minus the echoed input (it may hold NaN, which orjson cannot
        # encode, or a large body).
        detail = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
        for item in detail:
            if item.get("type") == "json_invalid":
                return JSONResponse({"detail": detail}, status_code=400)
        return JSONResponse({"detail": detail}, status_code=422)


def _install_openapi(app: FastAPI) -> None:
    """Add the hand-parsed metrics body's models to the schema's components."""
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        # Every 4xx answer has one shape (ours and FastAPI's validation errors alike).
        components["ValidationError"] = components["ErrorItem"] = ErrorItem.model_json_schema()
        components["HTTPValidationError"] = ErrorBody.model_json_schema(
            ref_template="#/components/schemas/{model}")
        components["HTTPValidationError"].pop("$defs", None)
        for model in (MetricsRows, MetricsColumnar):
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in js.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[model.__name__] = js
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
