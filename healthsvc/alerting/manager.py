"""The alert manager: findings in, alerts kept, notifications out through the outbox.

Flow: :meth:`AlertManager.process` folds a run's new findings into alerts (``model``), then
flushes the run's group if it is due (``policy``): for every subscription whose filters match,
the group's visible alerts (not silenced, not inhibited) go through :func:`needs_update`, and a
notification is rendered (``formats``) and enqueued (``outbox``) when it says so. A critical
group has ``group_wait_s=0``, so its first notification is enqueued inside the call that saw
the finding. :meth:`tick` resolves alerts whose condition stayed clear and flushes groups whose
wait or interval elapsed; the service calls it every second or so.

Two kinds of subscription bypass part of that: a ``pass_through`` subscription is sent every new
firing and every resolved alert at once, without grouping, inhibition or silences (its receiver,
typically an Alertmanager, does those); an ``alertmanager_api`` subscription is re-sent the firing
alerts it was last sent every ``resend_interval_s`` (the notifier's ``_resend``). A ``pagerduty``
subscription is sent an ``acknowledge`` event when an alert it was paged for is acknowledged.

The manager is small objects composed, each the one owner of its state: the
:class:`~healthsvc.alerting.notifier.Notifier` (alerts, the notification log, the groups: the
flow above), the :class:`~healthsvc.alerting.admin.SilenceBook` and the
:class:`~healthsvc.alerting.admin.Subscriptions`; which runs it holds is the run's ownership's
(:mod:`healthsvc.ownership`: every run, or with replicas those its replica owns).

Every change (a fold of new findings, a tick, an operator action) is made on its caller's
thread under the manager's one lock, in memory; its writes are collected as plain data
(:meth:`~healthsvc.store.outbox.Outbox.collect`) and submitted as ONE writer job *while the lock
is still held*, so the writer applies changes in the order memory saw them. The findings job
carries its fold's writes (:meth:`fold`: a finding, its alert and its page commit together); a
notification's first row is claimed in that job for the delivery worker (``hand_off``) and
handed over once it is durable. A job that fails leaves memory ahead of the store: the next
change reads the store back first (:meth:`_resync`). The writer never takes the lock.
Every method takes ``now`` (unix seconds) from the caller. State that must survive a restart
(alerts, silences, API subscriptions, the notification log) is written to the outbox's record
table on change and read back by the constructor.

Example::

    >>> from healthsvc_detectors.finding import Finding
    >>> from healthsvc.store.outbox import Outbox
    >>> from healthsvc.alerting.subscription import Subscription
    >>> m = AlertManager(Outbox(":memory:"), subscriptions=[Subscription("s", "http://127.0.0.1:9/h")])
    >>> f = Finding("non_finite", step=7, ranks=tuple(range(512)), severity="critical", metric="loss")
    >>> len(m.process("r1", [(f, ())], now=100.0))   # one notification for 512 ranks
    1
"""
from __future__ import annotations

import functools
import itertools
import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Sequence, TypeVar

from healthsvc_detectors.finding import SEVERITY_ORDER, Finding

from healthsvc.alerting.admin import AlertingError, NotFound, ReadOnly, SilenceBook, Subscriptions
from healthsvc.alerting.model import Alert, LifecyclePolicy
from healthsvc.alerting.notifier import (  # noqa: F401 - HandOff: the delivery worker's protocol
    NOT_GIVEN, HandOff, ManagerCounters, Notifier, Presentation, RollbackLookup,
)
from healthsvc.alerting.policy import Matcher, PolicyConfig, Silence, inhibited
from healthsvc.alerting.subscription import Subscription
from healthsvc.ownership import RunOwnership, SoleOwner
from healthsvc.store.ops import Ops, apply_ops
from healthsvc.store.outbox import Outbox

__all__ = ["AlertManager", "AlertingError", "NotFound", "ReadOnly"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# How long an operator's change waits for its job to be durable.
CHANGE_TIMEOUT_S = 60.0


def changes(method: F) -> F:
    """A method that changes alert state: made and submitted as one job (:meth:`AlertManager._change`);
    returns its value once the job is durable (raises what the method or the write raised)."""
    @functools.wraps(method)
    def changed(self: "AlertManager", *args: Any, **kwargs: Any) -> Any:
        return self._change(lambda: method(self, *args, **kwargs))[0].result(timeout=CHANGE_TIMEOUT_S)
    return changed  # type: ignore[return-value]


class AlertManager:
    """Alerts, silences, subscriptions and the notification log of one service process.

    ``on_enqueue`` is called after deliveries were enqueued (the service passes the delivery
    worker's ``wake``). ``rollback_lookup(run_id)`` may return ``{"step", "uri"}`` for the
    rollback annotation of corruption alerts. ``retention_s``: resolved alerts older than this
    are forgotten. ``ownership``: which runs' alerts this process holds (default: every run);
    ``on_changed_elsewhere(run_id)``: an operator changed an alert of a run another replica owns,
    once that is stored (the service tells the owner).
    """

    def __init__(
        self,
        outbox: Outbox,
        *,
        subscriptions: Iterable[Subscription] = (),
        policy: PolicyConfig = PolicyConfig(),
        lifecycle: LifecyclePolicy = LifecyclePolicy(),
        external_url: str = "",
        runbook_url: str = "",
        on_enqueue: Callable[[], None] | None = None,
        hand_off: HandOff | None = None,
        rollback_lookup: RollbackLookup | None = None,
        retention_s: float = 7 * 24 * 3600.0,
        ownership: RunOwnership | None = None,
        on_changed_elsewhere: Callable[[str], None] | None = None,
    ) -> None:
        self.outbox = outbox
        self.policy = policy
        self.external_url = external_url
        self.runbook_url = runbook_url
        self._lock = threading.RLock()
        self._stale = False   # a change's job failed: memory is ahead of the store (_resync)
        self._ownership: RunOwnership = ownership or SoleOwner()
        self._subscriptions = Subscriptions(outbox, subscriptions)
        self._silences = SilenceBook(outbox, policy.max_silences)
        self._notifier = Notifier(
            outbox, self._subscriptions, self._silences, self._ownership, policy=policy, lifecycle=lifecycle,
            shown=Presentation(external_url, runbook_url), retention_s=retention_s, on_enqueue=on_enqueue,
            hand_off=hand_off, rollback_lookup=rollback_lookup, on_changed_elsewhere=on_changed_elsewhere)

    def __repr__(self) -> str:
        return (f"AlertManager(alerts={len(self._notifier)}, subscriptions={len(self.subscriptions())}, "
                f"silences={len(self._silences)}, external_url={self.external_url!r})")

    @property
    def counters(self) -> ManagerCounters:
        return self._notifier.counters

    # -- the one way state changes ---------------------------------------------------------------

    def _change(self, change: Callable[[], T], write: Callable[[Ops], "Future[Any]"] | None = None
                ) -> "tuple[Future[T], Future[Any] | None]":
        """Make ``change()`` under the lock with its writes collected, and submit them while the
        lock is held (``write(ops)``: a job of the caller's that applies them, such as the
        findings job; by default a job of their own). Returns a future of ``change``'s value,
        resolved once the job is durable, and the job's own future (None: no job). What
        ``change`` decided before it raised is written too (it is in memory), and its error
        raised after. A write that fails marks memory as ahead of the store: the next change
        reads the store back first; if that read fails, so does the change (nothing made,
        nothing written). Never raises: every error is the futures'."""
        done: Future[T] = Future()
        with self._lock:
            try:
                if self._stale:
                    self._resync()
            except Exception as exc:  # noqa: BLE001 - the store is still down: the caller retries
                done.set_exception(exc)
                return done, None
            with self.outbox.collect() as ops:
                try:
                    value, error = change(), None
                except Exception as exc:  # noqa: BLE001 - raised to the caller once written
                    value, error = None, exc
            if not ops and write is None:   # nothing changed: no job
                if error is not None:
                    done.set_exception(error)
                else:
                    done.set_result(value)  # type: ignore[arg-type]
                return done, None
            job = write(ops) if write is not None else self.outbox.submit_job(lambda conn: apply_ops(conn, ops))
        job.add_done_callback(lambda fut: ops.ended(fut.exception() is None))

        def finished(fut: "Future[Any]") -> None:
            exc = fut.exception()
            if exc is not None:
                self._stale = True
                done.set_exception(exc)
            elif error is not None:
                done.set_exception(error)
            else:
                done.set_result(value)  # type: ignore[arg-type]
        job.add_done_callback(finished)
        return done, job

    def _resync(self) -> None:
        """Memory is ahead of the store (a change's job failed): wait for the jobs submitted
        before, then read the alerts, the log, the silences and the subscriptions back (under
        the lock). If the store cannot answer, the change that asked fails and the next tries."""
        self.outbox.settled()
        self._notifier.reload()
        self._reload_shared()
        self._stale = False
        log.warning("alerting: a write of alert state failed; alert state was read back from the store")

    # -- findings -----------------------------------------------------------------------------

    def fold(self, run_id: str, findings: Sequence[tuple[Finding, Sequence[str | None], float]], *,
             rollback_target: Callable[[], Any] | None, write: Callable[[Ops], "Future[Any]"]) -> "Future[Any]":
        """Fold a run's new findings into its alerts (each ``(finding, hosts, at)``: the host of
        each rank it blames, None where unknown, and when its input reached the service), then
        ``write(ops)``: the job that stores the findings with what folding them wrote. A
        finding is folded at ``at``; findings of one time fold together, in order, so what fell
        due between two of them goes out between them, as it would have live.

        ``rollback_target()`` is called (under the lock) when a corruption alert opens, for the
        target its page carries (None: no look-up). Resolves to what ``write``'s job returned."""
        def change() -> Any:
            target = NOT_GIVEN
            if rollback_target is not None and self._notifier.opens_latched(run_id, (f for f, _, _ in findings)):
                target = rollback_target()
            out: list[str] = []
            for at, of_time in itertools.groupby(findings, key=lambda item: item[2]):
                out += self._notifier.process(run_id, [(f, hosts) for f, hosts, _ in of_time], at, target)
            return out
        folded, job = self._change(change, write)
        folded.add_done_callback(_log_fold_error)
        return job or folded   # no job: the read-back before it failed

    def process(self, run_id: str, findings: Iterable[tuple[Finding, Sequence[str | None]]], now: float,
                *, rollback_target: Any = NOT_GIVEN) -> list[str]:
        """Fold findings into alerts at ``now`` and flush the run's group if due, as a job of its
        own; returns the webhook ids enqueued (tools and tests: the service folds with the
        findings' own job, :meth:`fold`). Each finding comes with the host of each rank it
        blames (None where unknown). ``rollback_target``: for a corruption alert that opens
        here (not given: looked up with ``rollback_lookup``)."""
        return self._change(lambda: self._notifier.process(run_id, findings, now, rollback_target))[0].result(
            timeout=CHANGE_TIMEOUT_S)

    @changes
    def tick(self, now: float) -> list[str]:
        """Resolve alerts whose condition stayed clear, flush due groups, forget old alerts."""
        return self._tick(now)

    def tick_later(self, now: float) -> Future[list[str]]:
        """:meth:`tick` as one job the caller does not wait for (the run's owner ticks its
        alerts between its detectors' inputs); resolves once the job is durable."""
        return self._change(lambda: self._tick(now))[0]

    def _tick(self, now: float) -> list[str]:
        if not self._ownership.holds_every_run():
            self._notifier.forget_unowned()
            self._reload_shared()
        return self._notifier.tick(now)

    def next_flush_at(self) -> float | None:
        """When the earliest group flush is due (unix s), for a caller that sleeps until then."""
        with self._lock:
            return self._notifier.next_flush_at()

    # -- operator actions ---------------------------------------------------------------------

    @changes
    def acknowledge(self, fp: str, by: str, now: float) -> Alert:
        return self._notifier.acknowledge(fp, by, now)

    @changes
    def resolve(self, fp: str, by: str, now: float) -> Alert:
        """Resolve by hand (latched alerts too); the resolution is notified at the next flush."""
        return self._notifier.resolve(fp, by, now)

    @changes
    def rollback(self, run_id: str, step: int, now: float, onset: int | None = None) -> list[Alert]:
        """A rollback to the checkpoint at ``step`` was performed: resolve the latched alerts of the
        run whose corruption began after it (their corrupted updates are gone); earlier onsets stay
        firing. ``onset`` is the run's estimated first corrupted update, the one ``GET /rollback``
        dates the incident by (its ``onset.low``): given, it decides for every latched alert of
        the run; without an estimate each alert's own onset (else first step) decides."""
        return self._notifier.rollback(run_id, step, now, onset)

    @changes
    def set_rollback_target(self, run_id: str, target: dict[str, Any] | None, now: float) -> None:
        """Annotate the run's firing corruption alerts with where to resume (``{"step", "uri"}``)."""
        self._notifier.set_rollback_target(run_id, target, now)

    # -- silences -----------------------------------------------------------------------------

    @changes
    def add_silence(self, matchers: Iterable[Matcher], starts_at: float, ends_at: float, now: float,
                    created_by: str = "", comment: str = "") -> Silence:
        return self._silences.add(matchers, starts_at, ends_at, now, created_by, comment)

    @changes
    def expire_silence(self, silence_id: str, now: float) -> Silence:
        """End a silence now (kept, listed as expired)."""
        return self._silences.expire(silence_id, now)

    def silences(self) -> list[Silence]:
        with self._lock:
            return self._silences.all()

    # -- subscriptions ------------------------------------------------------------------------

    def subscriptions(self) -> list[Subscription]:
        with self._lock:
            return self._subscriptions.all()

    def subscription(self, sub_id: str) -> Subscription:
        with self._lock:
            return self._subscriptions.get(sub_id)

    @changes
    def put_subscription(self, sub: Subscription, now: float) -> Subscription:
        """Create or replace an API subscription."""
        return self._subscriptions.put(sub, now)

    def delete_subscription(self, sub_id: str, now: float) -> int:
        """Delete an API subscription; its pending deliveries are cancelled (count returned)."""
        deleted: list[str] = []

        def change() -> None:
            self._subscriptions.delete(sub_id)   # raises for an unknown or read-only one
            self._notifier.drop_subscription(sub_id)
            deleted.append(sub_id)

        def job(conn: Any, ops: Ops) -> int:
            apply_ops(conn, ops)
            return self.outbox.cancel_pending(conn, sub_id, now) if deleted else 0
        done, written = self._change(change, lambda ops: self.outbox.submit_job(lambda conn: job(conn, ops)))
        done.result(timeout=CHANGE_TIMEOUT_S)   # raises what the deletion or its job raised
        assert written is not None
        return int(written.result())

    # -- queries ------------------------------------------------------------------------------

    def alerts(self, *, run: str | None = None, kind: str | None = None, status: str | None = None,
               min_severity: str | None = None, acknowledged: bool | None = None) -> list[Alert]:
        """Alerts, newest first, filtered by every argument that is set."""
        with self._lock:
            out = [a for a in self._notifier.known().values()
                   if (run is None or a.run == run) and (kind is None or a.kind == kind)
                   and (status is None or a.status == status)
                   and (min_severity is None or SEVERITY_ORDER[a.severity] >= SEVERITY_ORDER[min_severity])
                   and (acknowledged is None or (a.acknowledged_at is not None) == acknowledged)]
        return sorted(out, key=lambda a: a.starts_at, reverse=True)

    def alert(self, fp: str) -> Alert:
        with self._lock:
            return self._notifier.get(fp)

    def muting(self, alerts: Iterable[Alert], now: float) -> dict[str, dict[str, Any]]:
        """For each alert: ``{"silenced_by": [silence ids], "inhibited": bool}``."""
        with self._lock:
            alerts = list(alerts)
            inhibited_fps: set[str] = set()
            known = self._notifier.known()
            for run in {a.run for a in alerts}:
                inhibited_fps |= inhibited([a for a in known.values() if a.run == run],
                                           self.policy.inhibit_rules)
            return {a.fingerprint: {
                "silenced_by": self._silences.matching(a.routing_labels(), now),
                "inhibited": a.fingerprint in inhibited_fps,
            } for a in alerts}

    # -- the runs held (replicas: those the replica owns) ----------------------------------------

    @changes
    def adopt_run(self, run_id: str, now: float | None = None) -> list[str]:
        """This replica took the run over: load its alerts and notification log as the previous
        owner left them (what it sent is not sent again), and the silences and API subscriptions
        as they are now (any replica may have changed them), once the jobs submitted before
        are durable (what it reads includes this replica's own last writes). One change, under
        the lock: the run's next findings meet its loaded alerts.

        With ``now``, a group whose notification fell due while the run had no owner (the owner
        died between storing a finding and its group's flush) is sent here, before the findings
        of the run's restore are folded in: those may resolve it (the run finished meanwhile),
        and a group resolved before its first notification is never sent. Returns the webhook
        ids enqueued."""
        self.outbox.settled()
        self._notifier.load_run(run_id)
        self._reload_shared()
        return self._notifier.regroup(run_id, now)

    def forget_run(self, run_id: str) -> None:
        """Another replica owns the run now: keep nothing of it in memory (it is in the store)."""
        with self._lock:
            self._notifier.forget_run(run_id)

    def runs_held(self) -> int:
        """Runs whose alerts this manager holds in memory (``/metrics``)."""
        with self._lock:
            return self._notifier.runs_held()

    def keeps_run(self, run_id: str) -> bool:
        """The run has a group (firing alerts, or a resolution still owed): its owner must
        keep it."""
        with self._lock:
            return self._notifier.keeps_run(run_id)

    def _reload_shared(self) -> None:
        """Replicas: silences and API subscriptions may be changed through any replica; the
        owner reads them again at every tick (two small reads), so a silence made elsewhere
        mutes its pages within a tick."""
        self._silences.reload()
        self._subscriptions.reload()


def _log_fold_error(folded: "Future[Any]") -> None:
    if folded.exception() is not None:   # the findings job's own failure is its recorder's to handle
        log.warning("alerting: folding findings into alerts failed: %s", folded.exception())
