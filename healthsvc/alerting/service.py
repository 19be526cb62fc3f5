"""Alerting inside the service: the feature's ``install(app, ctx)``.

Wiring (see INTEGRATION.md of the repository's notes for the extension points):

- the outbox tables are registered with the store at install; the manager and the delivery
  worker start after the store opens and stop before it closes;
- newly stored findings are folded into alerts *inside the job that stores them*
  (``ctx.findings.set_stage``): the findings, their alert changes, the notifications, the
  outbox rows and the cursor commit as one transaction, so a crash never leaves a finding
  without its alert or its page. A corruption alert's page carries the rollback target: the
  run's owner (the monitor thread, recording the findings) looks it up *before* the job, with
  the new findings counted (:meth:`AlertingService.prepare`), so the page goes out with the job;
  the page's row is claimed in it for the delivery worker, which sends it once it is durable;
- the rest of a run's alert lifecycle is its owner's too, on the monitor thread
  (``healthsvc.monitor.hub``, which calls this service as its ``RunAlerts``): :meth:`tick` every
  ``alert_tick_s`` (group intervals, resolve timeouts; one job it does not wait for),
  :meth:`rolled_back` for a ``rollback`` event, :meth:`annotate` for a corruption alert opened
  without its rollback target (findings stored by hand, or folded at start), :meth:`owned` when
  the run is taken over or let go. There is no alerting thread. With detection off
  (``HEALTHSVC_DETECT=0``, a storage-only service) nothing owns runs, so nothing is found and no
  alert is ticked: alerts already stored stay as they are;
- each change the manager makes on its own is one store job
  (``healthsvc.alerting.admin.one_job``): an operator's action, on the request's thread;
- routers: ``/v1/alerts``, ``/v1/silences``, ``/v1/webhooks`` (``healthsvc.alerting.api``), and
  the runbook page ``/runbook`` (``healthsvc.alerting.runbook_page``);
- Prometheus: alerts by state, notifications by reason, webhook attempts by outcome, deliveries
  by state (a collector reading current values at scrape time).

The running service is ``app.state.alerting`` (an :class:`AlertingService`, built by the app factory
with the rollback feature's lookup, so corruption alerts carry the rollback target).
"""
from __future__ import annotations

import itertools
import logging
from collections import Counter
from concurrent.futures import Future
from typing import Any, Callable, TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from healthsvc.alerting.address_policy import AddressPolicy
from healthsvc.alerting.delivery import AttemptResult, Backoff, DeliveryWorker
from healthsvc.alerting.manager import AlertManager
from healthsvc.alerting.model import LifecyclePolicy
from healthsvc.store.outbox import Delivery, Outbox
from healthsvc.alerting.policy import DEFAULT_TIMINGS, PolicyConfig, Timing
from healthsvc.alerting.subscription import Subscription
from healthsvc.ownership import RunOwnership, SoleOwner

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


log = logging.getLogger(__name__)


def _folded_at(sf: Any, now: float) -> float:
    """When a stored finding is folded into alerts: when its input arrived, if known and not
    after ``now`` (see :meth:`AlertingService._fold`)."""
    return now if sf.observed_at is None else min(now, sf.observed_at)


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
    monitor hub's ``RunAlerts``)."""

    def __init__(self, outbox: Outbox, settings: Any, clock: Callable[[], float],
                 findings_after: Callable[..., list] | None = None,
                 newest_finding_id: Callable[[], int] | None = None,
                 rollback_lookup: Callable[..., dict | None] | None = None,
                 onset_lookup: Callable[[str], int | None] | None = None,
                 ownership: RunOwnership | None = None, run_findings_after: Callable[..., list] | None = None) -> None:
        self.outbox = outbox
        # A run's alert lifecycle is its owner's (healthsvc.ownership). A process that holds
        # every run keeps one cursor; where runs change hands (replicas) the cursor is per run
        # ("findings:<run>"), and a run taken over is loaded from the store and its unprocessed
        # findings processed (_adopt).
        self.ownership: RunOwnership = ownership or SoleOwner()
        self._run_findings_after = run_findings_after
        # A persisted cursor (the id of the newest finding processed, written in the job that
        # processes it) says which stored findings are still to fold into alerts: those stored
        # before start() (the monitor's replay runs first) or by a job whose stage failed.
        self._findings_after = findings_after
        self._newest_finding_id = newest_finding_id
        self._live = False            # start() processed what was stored before it
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

    # -- listeners (store writer thread: enqueue only) ----------------------------------------

    def prepare(self, run_id: str, attempt: int, findings: list) -> dict[str, Any]:
        """Before the findings job, on the run's owner's thread: when the findings open a
        corruption alert, its rollback target, looked up with them counted (the page goes out
        in the job, with its target; the writer thread never reads the history)."""
        m = self.manager
        if not self._live or m is None or self.rollback_lookup is None or not m.opens_latched(run_id, findings):
            return {}
        try:
            return {run_id: self.rollback_lookup(run_id, (attempt, findings))}
        except Exception:  # an annotation must never stop an alert
            log.exception("alerting: no rollback target for run %s", run_id)
            return {run_id: None}

    def in_job(self, conn: Any, stored: list, prepared: dict[str, Any] | None = None) -> list[Callable[[], None]]:
        """The findings stage: inside the job that stored ``stored`` (on the writer thread), fold
        every finding after the cursor into alerts, notifications, outbox rows and the cursor, on
        ``conn``, with the rollback targets ``prepare`` looked up (by run). Returns what to run
        once the job is durable (hand the pages to the delivery worker; a corruption alert
        opened without a target, e.g. of a finding stored by hand, has it looked up)."""
        if not self._live:
            return []  # start() will: it processes everything after the cursor, as a job
        with self.outbox.bound(conn) as after:
            self._process_pending(conn, stored, prepared or {})
        return after   # a target still awaited: the run's owner annotates (it watches the commits)

    def _process_pending(self, conn: Any, stored: list | None = None, targets: dict[str, Any] | None = None) -> None:
        assert self.manager is not None
        if not self.ownership.holds_every_run():
            # Only a run's owner stores its findings (the monitor's writes are fenced), so the
            # runs of this job are this replica's to alert on, even before its lease shows here
            # (findings stored by hand, by tools and tests).
            for run_id in sorted({sf.run_id for sf in stored or ()}):
                self._process_run(conn, run_id, stored, targets)
            return
        # Without a way to read the findings table, only what this job stored is known.
        def stored_after(after: int, conn: Any = None) -> list:
            return [sf for sf in stored or () if sf.id > after]
        fetch: Callable[..., list] = self._findings_after or stored_after
        saved = self.outbox.records("cursor", conn=conn).get("findings")
        cursor = int(saved["id"]) if saved is not None else 0
        while pending := fetch(cursor, conn=conn):
            by_run: dict[str, list] = {}
            for sf in pending:
                by_run.setdefault(sf.run_id, []).append(sf)
            now = self.clock()
            for run_id, of_run in by_run.items():
                self._fold(run_id, of_run, now, targets)
            cursor = max(sf.id for sf in pending)
            self.outbox.put_record("cursor", "findings", {"id": cursor}, now)

    def _process_run(self, conn: Any, run_id: str, stored: list | None = None,
                     targets: dict[str, Any] | None = None) -> None:
        """Replicas: fold the run's findings after its own cursor into alerts, in the job."""
        assert self.manager is not None
        records = self.outbox.records("cursor", conn=conn)
        saved = records.get(f"findings:{run_id}")
        if saved is None:  # no replica processed findings of it yet (or a single server did)
            saved = records.get("findings") or {"id": 0}
        cursor = int(saved["id"])
        if self._run_findings_after is not None:
            pending = self._run_findings_after(run_id, cursor, conn=conn)
        else:
            pending = [sf for sf in stored or () if sf.run_id == run_id and sf.id > cursor]
        if not pending:
            return
        now = self.clock()
        self._fold(run_id, pending, now, targets)
        self.outbox.put_record("cursor", f"findings:{run_id}", {"id": max(sf.id for sf in pending)}, now)

    def _fold(self, run_id: str, stored: list, now: float, targets: dict[str, Any] | None = None) -> None:
        """Fold a run's stored findings (oldest first) into its alerts, in the current job, with
        the rollback target its owner looked up (``prepare``), if it did.

        Each finding is folded at the time its input reached the service (``observed_at``), not
        later than ``now``: what a receiver is told must not depend on how late the run's owner
        judged the data. Alertmanager times a group's wait from when an alert reached it; an
        alert reaches alerting here when its data reached the service, and the owner's delay is
        the service's own (a takeover's or a restart's replay judges minutes of pushes in a
        moment: folded at its pace, a lasting loss spike fires and clears within its group's
        wait and is never paged). Findings of one time fold together, in order, so what fell
        due between two of them goes out between them, as it would have live."""
        assert self.manager is not None
        target = ({"rollback_target": targets[run_id]} if targets is not None and run_id in targets
                  else {"target_later": True})
        for at, of_time in itertools.groupby(stored, key=lambda sf: _folded_at(sf, now)):
            self.manager.process(run_id, [(sf.finding, sf.hosts) for sf in of_time], at, **target)

    # -- the run's owner's calls (the monitor thread) -------------------------------------------

    def owned(self, run_id: str, gained: bool) -> None:
        """The monitor hub took the run over (or let it go), on its thread, before it records the
        findings of the run's restore: the run's alerts are loaded and its unprocessed findings
        processed first, as jobs of the writer, ahead of the findings jobs that follow."""
        if self.manager is None:
            return   # start() adopts what is held by then
        if not gained:
            self.manager.forget_run(run_id)
            return
        self._adopt(run_id)

    def keeps_run(self, run_id: str) -> bool:
        """Whether the run's alerts still need their owner (the monitor hub asks before letting a
        finished run go): a group open (a page, a reminder or a resolution owed), or a rollback
        target awaited."""
        return self.manager is not None and self.manager.keeps_run(run_id)

    def _adopt(self, run_id: str) -> None:
        assert self.manager is not None
        self.manager.adopt_run(run_id, self.clock())   # what fell due meanwhile is sent now

        def job(conn: Any) -> None:
            self._process_run(conn, run_id)
        self.outbox.run_in_job(job)
        self.annotate()

    def awaiting(self) -> bool:
        """Whether a corruption alert waits for its rollback target (:meth:`annotate`)."""
        return bool(self.manager is not None and self.manager.awaiting_target)

    def annotate(self) -> None:
        """Look up the rollback target of every run whose corruption alert opened without it
        (it is decided from the stored findings: read here, not in the job), annotate its
        alerts and send what its group held back; one job per run."""
        m = self.manager
        if m is None:
            return
        for run_id in sorted(m.awaiting_target):
            m.annotate(run_id, self.clock())

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
        if m is None or not self._live:
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
        self._replay_unprocessed()
        self.worker.start()

    def _replay_unprocessed(self) -> None:
        """Process the findings stored after the cursor (before start, or before a crash), as
        one job: later findings jobs, which run after it, process their own."""
        if not self.ownership.holds_every_run():
            # Replicas: per run, when this one takes a run (_adopt); the runs it took before
            # alerting started (a restarted replica takes its leases back at once) now.
            self._live = True
            for run_id in sorted(self.ownership.held()):
                self._adopt(run_id)
            return

        def job(conn: Any) -> None:
            if self.outbox.records("cursor", conn=conn).get("findings") is None:
                # No cursor yet (a new store, or one from a version without it): start at the
                # newest finding, so an upgrade does not page again for everything ever found.
                newest = self._newest_finding_id() if self._newest_finding_id else 0
                self.outbox.put_record("cursor", "findings", {"id": newest}, self.clock())
            self._process_pending(conn)
            self._live = True
        self.outbox.run_in_job(job)
        self.annotate()

    def stop(self) -> None:
        self._live = False
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
