"""Alerting inside the service: the feature's ``install(app, ctx)``.

Wiring (``docs/architecture.md`` draws it):

- the outbox tables are registered with the store at install; the manager and the delivery
  worker start after the store opens and before the monitor (which records findings from its
  first restore on), and stop after it;
- new findings are folded into alerts by the thread that records them, the run's owner (the
  monitor), *before* the job that stores them (``ctx.findings.set_stage``: :meth:`AlertingService.fold`):
  the alert changes, the notifications and the outbox rows are collected as plain data and
  written by the findings' own job, so a finding, its alert and its page commit together and a
  crash never leaves one without the others. A corruption alert's page carries the rollback
  target, looked up then with the new findings counted; the page's row is claimed in the job for
  the delivery worker, which sends it once it is durable;
- the rest of a run's alert lifecycle is its owner's too, on the monitor thread
  (``healthsvc.monitor.hub``, which calls this service as its ``RunAlerts``): :meth:`tick` every
  ``alert_tick_s`` (group intervals, resolve timeouts; one job it does not wait for),
  :meth:`rolled_back` for a ``rollback`` event, :meth:`owned` when the run is taken over or let
  go. There is no alerting thread. With detection off (``HEALTHSVC_DETECT=0``, a storage-only
  service) nothing owns runs, so nothing is found and no alert is ticked: alerts already stored
  stay as they are;
- an operator's action is one change of the manager (``AlertManager._change``), made on the
  request's thread under the manager's lock and written as one job submitted under it: every
  change reaches the writer in the order it was made;
- routers: ``/v1/alerts``, ``/v1/silences``, ``/v1/webhooks`` (``healthsvc.alerting.api``), and
  the runbook page ``/runbook`` (``healthsvc.alerting.runbook_page``);
- Prometheus: alerts by state, notifications by reason, webhook attempts by outcome, deliveries
  by state (a collector reading current values at scrape time).

The running service is ``app.state.alerting`` (an :class:`AlertingService`, built by the app factory
with the rollback feature's lookup, so corruption alerts carry the rollback target).
"""
from __future__ import annotations

import logging
from collections import Counter
from concurrent.futures import Future
from typing import Any, Callable, Sequence, TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from healthsvc.alerting.address_policy import AddressPolicy
from healthsvc.alerting.delivery import AttemptResult, Backoff, DeliveryWorker
from healthsvc.alerting.manager import AlertManager
from healthsvc.alerting.model import LifecyclePolicy
from healthsvc.store.outbox import Delivery, Ops, Outbox
from healthsvc.alerting.policy import DEFAULT_TIMINGS, PolicyConfig, Timing
from healthsvc.alerting.subscription import Subscription
from healthsvc.ownership import RunOwnership, SoleOwner

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.findings.service import Found
    from healthsvc.context import ServiceContext


log = logging.getLogger(__name__)


def policy_from_settings(settings: Any) -> PolicyConfig:
    timings = dict(DEFAULT_TIMINGS)
    for severity, override in (settings.alert_timings or {}).items():
        if severity not in timings:
            raise ValueError(f"alert_timings: unknown severity {severity!r}; expected one of {tuple(timings)}")
        base = timings[severity]
        timings[severity] = Timing(**{**base.__dict__, **override})
    return PolicyConfig(timings=timings, max_silences=settings.alert_max_silences)


class AlertingService:
    """The manager and the delivery worker; what a run's owner calls for its runs' alerts (the
    monitor hub's ``RunAlerts``) and for the findings it records (the findings' ``AlertStage``)."""

    def __init__(self, outbox: Outbox, settings: Any, clock: Callable[[], float],
                 rollback_lookup: Callable[..., dict | None] | None = None,
                 onset_lookup: Callable[[str], int | None] | None = None,
                 ownership: RunOwnership | None = None) -> None:
        self.outbox = outbox
        # A run's alert lifecycle is its owner's (healthsvc.ownership): where runs change hands
        # (replicas), a run taken over is loaded from the store (owned).
        self.ownership: RunOwnership = ownership or SoleOwner()
        self.settings = settings
        self.clock = clock
        self.manager: AlertManager | None = None
        self.worker: DeliveryWorker | None = None
        self.attempts: Counter[str] = Counter()
        self._last_tick = float("-inf")
        self._ticking: Future | None = None   # the tick job in flight, if any
        self.settings_subscriptions = [Subscription.from_dict({**d, "source": "settings"})
                                       for d in settings.alert_webhooks]
        self.address_policy = AddressPolicy.parse(getattr(settings, "webhook_allowed_networks", ""))
        # (run_id[, (attempt, findings not stored yet)]) -> {"step", "uri"} | None, for the
        # annotations of corruption alerts.
        self.rollback_lookup = rollback_lookup
        # run_id -> the estimated first corrupted update (GET /rollback's onset.low) | None: the
        # one onset a rollback resolves latched alerts by.
        self.onset_lookup = onset_lookup

    def alert_states(self, run_id: str) -> dict[str, Any]:
        """The run's alerts by fingerprint (none before start): run health reads them."""
        m = self.manager
        return {} if m is None else {a.fingerprint: a for a in m.alerts(run=run_id)}

    # -- the findings' stage (on the recording thread: the run's owner) ------------------------

    def fold(self, run_id: str, attempt: int, found: Sequence[Found],
             write: Callable[[Ops], Future]) -> Future:
        """Fold a run's new findings into its alerts before their job, and submit that job with
        what the fold wrote (``write``). A corruption alert that opens takes the run's rollback
        target, looked up now with these findings counted (the writer thread never reads the
        history).

        Each finding is folded at the time its input reached the service (``at``), not later
        than now: what a receiver is told must not depend on how late the run's owner judged
        the data. Alertmanager times a group's wait from when an alert reached it; an alert
        reaches alerting here when its data reached the service, and the owner's delay is the
        service's own (a takeover's or a restart's replay judges minutes of pushes in a moment:
        folded at its pace, a lasting loss spike fires and clears within its group's wait and
        is never paged)."""
        m = self.manager
        if m is None:   # not started: stored without alerts (the service starts alerting first)
            log.warning("alerting not started: %d findings of run %s stored without alerts", len(found), run_id)
            return write(Ops())
        now = self.clock()
        items = [(f, hosts, now if at is None else min(now, at)) for f, hosts, at in found]
        target = (None if self.rollback_lookup is None
                  else lambda: self._rollback_target(run_id, attempt, [f for f, _, _ in found]))
        return m.fold(run_id, items, rollback_target=target, write=write)

    def _rollback_target(self, run_id: str, attempt: int, findings: list) -> dict[str, Any] | None:
        assert self.rollback_lookup is not None
        try:
            return self.rollback_lookup(run_id, (attempt, findings))
        except Exception:  # an annotation must never stop an alert
            log.exception("alerting: no rollback target for run %s", run_id)
            return None

    # -- the run's owner's calls (the monitor thread) -------------------------------------------

    def owned(self, run_id: str, gained: bool) -> None:
        """The monitor hub took the run over (or let it go), on its thread, before it records the
        findings of the run's restore: the run's alerts are loaded first, and what fell due
        while it had no owner is sent."""
        if self.manager is None:
            return
        if not gained:
            self.manager.forget_run(run_id)
            return
        self.manager.adopt_run(run_id, self.clock())

    def keeps_run(self, run_id: str) -> bool:
        """Whether the run's alerts still need their owner (the monitor hub asks before letting a
        finished run go): a group open (a page, a reminder or a resolution owed)."""
        return self.manager is not None and self.manager.keeps_run(run_id)

    def rolled_back(self, run_id: str, step: int) -> None:
        """The run resumed from the checkpoint at ``step`` (a ``rollback`` event): its latched
        alerts whose corruption began after it resolve."""
        if self.manager is not None:
            self.manager.rollback(run_id, step, self.clock(), onset=self._incident_onset(run_id))

    def tick(self, now: float, asked: bool = False) -> None:
        """Every ``alert_tick_s`` (or at once when ``asked``, by a drain): resolve the alerts
        whose condition stayed clear, flush due groups. One job, not waited for: the owner goes
        on with its detectors meanwhile, and a writer that is slow or a database that is down
        holds up alerting, not detection. One tick at a time unless asked."""
        m = self.manager
        if m is None or self.worker is None:
            return
        busy = self._ticking is not None and not self._ticking.done()
        if not asked and (busy or now - self._last_tick < self.settings.alert_tick_s):
            return
        self._last_tick = now
        self._ticking = m.tick_later(now)
        self._ticking.add_done_callback(_log_failure)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        for sub in self.settings_subscriptions:  # a misconfigured receiver stops the start, loudly
            why = self.address_policy.refusal(sub.url, unresolvable_ok=True)
            if why:
                raise ValueError(f"HEALTHSVC_ALERT_WEBHOOKS subscription {sub.id!r}: {why}")
        self.worker = DeliveryWorker(
            self.outbox, timeout_s=s.alert_delivery_timeout_s,
            backoff=Backoff(base_s=s.alert_retry_base_s, cap_s=s.alert_retry_cap_s),
            max_age_s=s.alert_dead_after_s, clock=self.clock, on_attempt=self._count_attempt,
            headers_for=self._headers_for, address_policy=self.address_policy)
        self.manager = AlertManager(
            self.outbox, subscriptions=self.settings_subscriptions, policy=policy_from_settings(s),
            lifecycle=LifecyclePolicy(resolve_timeout_s=s.alert_resolve_timeout_s),
            external_url=s.public_url(), runbook_url=s.runbook_url(), on_enqueue=self.worker.wake,
            hand_off=self.worker, rollback_lookup=self.rollback_lookup, ownership=self.ownership,
            on_changed_elsewhere=lambda run_id: self.ownership.tell_owner(
                run_id, {"event": "alerts_changed", "data": {}, "at": self.clock()}))
        self.worker.start()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    def _incident_onset(self, run_id: str) -> int | None:
        try:
            return self.onset_lookup(run_id) if self.onset_lookup is not None else None
        except Exception:  # no estimate: each alert's own onset decides
            log.exception("alerting: no onset estimate for run %s", run_id)
            return None

    def _headers_for(self, subscription_id: str) -> dict[str, str]:
        """A subscription's own request headers at attempt time (none once it was deleted)."""
        try:
            return self.manager.subscription(subscription_id).request_headers() if self.manager else {}
        except Exception:
            return {}

    def _count_attempt(self, d: Delivery, r: AttemptResult) -> None:
        self.attempts["delivered" if r.delivered else ("retryable_error" if r.retryable else "failed")] += 1


def _log_failure(done: Future) -> None:
    if done.exception() is not None:   # the next tick does what this one could not
        log.error("alerting: a tick failed: %s", done.exception())


class _AlertingCollector:
    """Prometheus collector: current values at scrape time."""

    def __init__(self, service: AlertingService) -> None:
        self.service = service

    def collect(self):
        m = self.service.manager
        alerts = GaugeMetricFamily("healthsvc_alerts", "Alerts kept, by status and severity.",
                                   labels=["status", "severity"])
        notes = CounterMetricFamily("healthsvc_alert_notifications", "Notifications enqueued, by reason.",
                                    labels=["reason"])
        findings = CounterMetricFamily("healthsvc_alert_findings", "Findings processed by alerting.")
        attempts = CounterMetricFamily("healthsvc_webhook_attempts", "Webhook delivery attempts, by outcome.",
                                       labels=["outcome"])
        deliveries = GaugeMetricFamily("healthsvc_webhook_deliveries", "Webhook deliveries in the outbox, by state.",
                                       labels=["state"])
        if m is not None:
            counts = Counter((a.status, a.severity) for a in m.alerts())
            for status in ("firing", "resolved"):
                for sev in ("info", "warning", "critical"):
                    alerts.add_metric([status, sev], counts.get((status, sev), 0))
            for reason, n in sorted(m.counters.notifications.items()):
                notes.add_metric([reason], n)
            findings.add_metric([], m.counters.findings)
            for state, n in self.service.outbox.state_counts().items():
                deliveries.add_metric([state], n)
        for outcome in ("delivered", "retryable_error", "failed"):
            attempts.add_metric([outcome], self.service.attempts.get(outcome, 0))
        yield from (alerts, notes, findings, attempts, deliveries)


def install(app: Any, ctx: ServiceContext) -> None:
    """The feature: its router, listeners, start/stop hooks and collector (``ctx.alerting`` is
    built by the app factory)."""
    from healthsvc.alerting.api import router
    from healthsvc.alerting.runbook_page import router as runbook_router

    service = ctx.alerting
    app.state.alerting = service
    app.include_router(router)
    app.include_router(runbook_router)
    ctx.findings.set_stage(service)
    ctx.on_startup.append(service.start)
    ctx.on_shutdown.append(service.stop)
    ctx.metrics.registry.register(_AlertingCollector(service))
