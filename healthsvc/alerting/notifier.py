"""The notify pipeline of the alert manager: findings folded into alerts, alerts into groups,
groups flushed into notifications and outbox rows (see :mod:`healthsvc.alerting.manager` for
the flow). A :class:`Notifier` is the one owner of the alert state: the alerts, the notification
log, the groups, and which runs changed or wait for their rollback target. It reads the
subscriptions and silences through their own objects (:mod:`healthsvc.alerting.admin`), and asks
the run's ownership (:mod:`healthsvc.ownership`) which runs are its to hold.

Not thread-safe, and every change writes records: the
:class:`~healthsvc.alerting.manager.AlertManager` calls it under its lock, with the outbox's
writes collected (``Outbox.collect``) into the job its caller submits.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Protocol, Sequence

from healthsvc_detectors.finding import SEVERITY_ORDER, Finding

from healthsvc.alerting import model
from healthsvc.alerting.admin import NotFound, SilenceBook, Subscriptions
from healthsvc.alerting.formats import Notification, render_all
from healthsvc.alerting.model import Alert, LifecyclePolicy
from healthsvc.alerting.policy import (
    NotificationLogEntry, NotifyReason, PolicyConfig, flush_due, group_key,
    group_timing, inhibited, needs_update, next_flush_at, resolution_due,
)
from healthsvc.alerting.subscription import Subscription
from healthsvc.identity import alert_fingerprint
from healthsvc.ownership import RunOwnership
from healthsvc.store.outbox import Outbox, new_webhook_id

RollbackLookup = Callable[[str], "dict[str, Any] | None"]
# A rollback target not given (``process`` looks it up).
NOT_GIVEN: Any = object()


class HandOff(Protocol):
    """The delivery worker's side of a page enqueued by a change: ``reserve`` (while the change
    is made) says for how long to claim the row for this worker in the change's job, or None to
    leave it to the worker's own claim; ``take`` (once the job is durable) hands the claimed row
    over to be sent at once; ``release`` (the job failed) gives the reservation back."""

    def reserve(self, subscription_id: str, webhook_id: str) -> float | None: ...
    def take(self, webhook_id: str) -> None: ...
    def release(self, webhook_id: str) -> None: ...


@dataclass
class _Group:
    """Aggregation state of one run's group (rebuilt from alerts and the log after a restart)."""

    first_alert_at: float
    last_flush_at: float | None = None
    resolved_pending: set[str] = field(default_factory=set)


@dataclass
class ManagerCounters:
    """Monotonic counters for /metrics."""

    findings: int = 0
    alerts_opened: dict[str, int] = field(default_factory=dict)
    notifications: dict[str, int] = field(default_factory=dict)   # by reason


@dataclass(frozen=True)
class Presentation:
    """What a notification shows beside its alerts."""

    external_url: str = ""
    runbook_url: str = ""


class Notifier:
    """Alerts, the notification log and the groups of the runs this process holds (every run, or
    with replicas those its replica owns: none at start; :meth:`load_run` loads a run's when the
    replica takes it over, :meth:`forget_run` drops them when it goes)."""

    def __init__(self, outbox: Outbox, subscriptions: Subscriptions, silences: SilenceBook,
                 ownership: RunOwnership, *, policy: PolicyConfig, lifecycle: LifecyclePolicy,
                 shown: Presentation, retention_s: float, on_enqueue: Callable[[], None] | None,
                 hand_off: HandOff | None, rollback_lookup: RollbackLookup | None,
                 on_changed_elsewhere: Callable[[str], None] | None) -> None:
        self.outbox = outbox
        self.policy = policy
        self.lifecycle = lifecycle
        self.shown = shown
        self.retention_s = retention_s
        self.counters = ManagerCounters()
        self._subscriptions = subscriptions
        self._silences = silences
        self._ownership = ownership
        self._on_enqueue = on_enqueue
        self._hand_off = hand_off
        self._rollback_lookup = rollback_lookup
        self._on_changed_elsewhere = on_changed_elsewhere
        self._alerts: dict[str, Alert] = {}
        self._nflog: dict[tuple[str, str], NotificationLogEntry] = {}
        self._groups: dict[str, _Group] = {}
        self._changed_runs: set[str] = set()   # runs whose alerts changed (pass-through)
        # (subscription, run) -> last time an alertmanager_api receiver got every firing alert
        # (memory only: after a restart the first re-send is at once, which is harmless).
        self._resent_at: dict[tuple[str, str], float] = {}
        self.reload()   # every run's, where one process holds them all; else none yet

    def __len__(self) -> int:
        return len(self._alerts)

    # -- findings -----------------------------------------------------------------------------

    def process(self, run_id: str, findings: Iterable[tuple[Finding, Sequence[str | None]]], now: float,
                rollback_target: Any = NOT_GIVEN) -> list[str]:
        """See :meth:`~healthsvc.alerting.manager.AlertManager.process`."""
        # What fell due before these findings goes out first, as it stood: a tick comes late
        # when the run's owner is busy (a takeover's replay) or the writer is, and a finding
        # folded meanwhile must not change what a receiver is told. Without this, a warning that
        # fired past its group's wait and is resolved by the next finding was never paged.
        enqueued = self._flush(run_id, now)
        for f, hosts in findings:
            self._apply(run_id, f, hosts, now, rollback_target)
        return enqueued + self._flush(run_id, now) + self._pass_through(now)

    def opens_latched(self, run_id: str, findings: Iterable[Finding]) -> bool:
        if self._rollback_lookup is None:
            return False
        alerts = [a for a in self._alerts.values() if a.run == run_id]
        for f in findings:
            if f.status != "firing" or not model.is_latched(f.kind):
                continue
            existing = self._alerts.get(alert_fingerprint(run_id, f, alerts))
            if existing is None or existing.status == "resolved":
                return True
        return False

    def tick(self, now: float) -> list[str]:
        """Resolve alerts whose condition stayed clear, flush due groups, forget old alerts."""
        for fp, a in list(self._alerts.items()):
            b = model.expire(a, now, self.lifecycle)
            if b is not a:
                self._store_alert(b, now)
            elif a.status == "resolved" and a.ends_at is not None and now - a.ends_at > self.retention_s:
                del self._alerts[fp]
                self.outbox.delete_record("alert", fp)
        enqueued: list[str] = []
        for run in list(self._groups):
            enqueued += self._flush(run, now)
        return enqueued + self._pass_through(now) + self._resend(now)

    def next_flush_at(self) -> float | None:
        times = [next_flush_at(g.first_alert_at, g.last_flush_at, group_timing(self._group_alerts(r), self.policy.timings))
                 for r, g in self._groups.items()]
        return min(times, default=None)

    # -- operator actions ---------------------------------------------------------------------

    def acknowledge(self, fp: str, by: str, now: float) -> Alert:
        a = model.acknowledge(self.get(fp), now, by)
        self._store_alert(a, now)
        self._tell_owner(a.run)
        for sub in self._subscriptions.all():
            entry = self._nflog.get((sub.id, a.run))
            if (sub.format == "pagerduty" and a.status == "firing" and entry is not None
                    and a.fingerprint in entry.firing):
                self._enqueue(sub, a.run, NotifyReason.ACKNOWLEDGED, [a], now)
        return a

    def resolve(self, fp: str, by: str, now: float) -> Alert:
        a = model.resolve_by_hand(self.get(fp), now, by)
        a = model.acknowledge(a, now, by) if a.acknowledged_at is None else a
        self._store_alert(a, now)
        self._tell_owner(a.run)
        self._flush(a.run, now)
        self._pass_through(now)
        return a

    def rollback(self, run_id: str, step: int, now: float, onset: int | None = None) -> list[Alert]:
        done = []
        for a in list(self._alerts.values()):
            began = onset if onset is not None else (a.onset_step if a.onset_step is not None else a.first_step)
            if a.run == run_id and a.latched and a.status == "firing" and began > step:
                b = model.resolve_by_hand(a, now, "rollback")
                self._store_alert(b, now)
                done.append(b)
        self._flush(run_id, now)
        self._pass_through(now)
        return done

    def set_rollback_target(self, run_id: str, target: dict[str, Any] | None, now: float) -> None:
        for a in list(self._alerts.values()):
            if a.run == run_id and a.latched and a.status == "firing" and a.rollback_target != target:
                self._store_alert(replace(a, rollback_target=target), now)

    def drop_subscription(self, sub_id: str) -> None:
        """A subscription was deleted: its log entries go with it."""
        for key in [k for k in self._nflog if k[0] == sub_id]:
            del self._nflog[key]
            self._resent_at.pop(key, None)
            self.outbox.delete_record("nflog", "|".join(key))

    # -- queries ------------------------------------------------------------------------------

    def known(self) -> dict[str, Alert]:
        """Every alert: this process's own; where runs change hands, also those of the runs other
        replicas own, as they stored them (any replica answers any read)."""
        if self._ownership.holds_every_run():
            return self._alerts
        known = {k: Alert.from_dict(v) for k, v in self.outbox.records("alert").items()}
        known.update(self._alerts)
        return known

    def get(self, fp: str) -> Alert:
        a = self._alerts.get(fp) or self.known().get(fp)
        if a is None:
            raise NotFound(f"no alert with fingerprint {fp!r}")
        return a

    # -- the runs held ------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the alerts and the notification log of the runs held back from the store (at
        start, and when a change's job failed, leaving memory ahead of it): every run where one
        process holds them all, else the runs held (none at start)."""
        every = self._ownership.holds_every_run()
        held = {a.run for a in self._alerts.values()} | {run for _, run in self._nflog}
        if not every and not held:
            return
        alerts = {k: Alert.from_dict(v) for k, v in self.outbox.records("alert").items()}
        nflog = {_log_key(k): NotificationLogEntry.from_dict(v) for k, v in self.outbox.records("nflog").items()}
        self._alerts = {k: a for k, a in alerts.items() if every or a.run in held}
        self._nflog = {k: e for k, e in nflog.items() if every or k[1] in held}
        self._resent_at = {k: t for k, t in self._resent_at.items() if k in self._nflog}
        self._groups = {}
        self._rebuild_groups()
        self._changed_runs = set(self._groups)

    def load_run(self, run_id: str) -> None:
        """Load the run's alerts and notification log as the store has them (its previous owner
        left them), replacing what is held of it (then :meth:`regroup`)."""
        self.forget_run(run_id)
        for k, v in self.outbox.records("alert").items():
            if v.get("run") == run_id:
                self._alerts[k] = Alert.from_dict(v)
        for k, v in self.outbox.records("nflog").items():
            sub, run = _log_key(k)
            if run == run_id:
                self._nflog[(sub, run)] = NotificationLogEntry.from_dict(v)

    def regroup(self, run_id: str, now: float | None) -> list[str]:
        """After :meth:`load_run` (and the subscriptions and silences read again): rebuild the
        run's group and, with ``now``, flush it if it is due."""
        self._rebuild_groups(only=run_id)
        self._changed_runs.add(run_id)
        return self._flush(run_id, now) if now is not None else []

    def forget_unowned(self) -> None:
        """Forget the runs whose lease ran out here: the next owner carries on."""
        for run in {a.run for a in self._alerts.values()}:
            if not self._ownership.owns(run):
                self.forget_run(run)

    def forget_run(self, run_id: str) -> None:
        """Another replica owns the run now: keep nothing of it in memory (it is in the store)."""
        for fp in [fp for fp, a in self._alerts.items() if a.run == run_id]:
            del self._alerts[fp]
        for key in [k for k in self._nflog if k[1] == run_id]:
            del self._nflog[key]
            self._resent_at.pop(key, None)
        self._groups.pop(run_id, None)
        self._changed_runs.discard(run_id)

    def runs_held(self) -> int:
        return len({a.run for a in self._alerts.values()})

    def keeps_run(self, run_id: str) -> bool:
        return run_id in self._groups

    def _tell_owner(self, run_id: str) -> None:
        """An operator changed an alert of a run another replica owns (the request reached this
        one): once it is stored, the owner reloads the run's alerts (``on_changed_elsewhere``)."""
        tell = self._on_changed_elsewhere
        if tell is None or self._ownership.owns(run_id):
            return
        self._when_written(lambda durable: tell(run_id) if durable else None)

    # -- internals ----------------------------------------------------------------------------

    def _apply(self, run_id: str, f: Finding, hosts: Sequence[str | None], now: float,
               target: Any = NOT_GIVEN) -> None:
        self.counters.findings += 1
        fp = alert_fingerprint(run_id, f, (a for a in self._alerts.values() if a.run == run_id))
        existing = self._alerts.get(fp)
        if f.status == "resolved":
            if existing is not None and existing.status == "firing":
                self._store_alert(model.clear(existing, now), now)
            return
        a = model.fire(existing, f, run_id, hosts, now, self.lifecycle)
        if existing is None or existing.status == "resolved":
            self.counters.alerts_opened[f.kind] = self.counters.alerts_opened.get(f.kind, 0) + 1
            if a.latched and self._rollback_lookup is not None:
                if target is not NOT_GIVEN:
                    a = replace(a, rollback_target=target)
                else:
                    a = replace(a, rollback_target=self._safe_rollback(run_id))
        self._store_alert(a, now)

    def _safe_rollback(self, run_id: str) -> dict[str, Any] | None:
        try:
            return self._rollback_lookup(run_id) if self._rollback_lookup else None
        except Exception:  # an annotation must never stop an alert
            return None

    def _store_alert(self, a: Alert, now: float) -> None:
        before = self._alerts.get(a.fingerprint)
        self._alerts[a.fingerprint] = a
        self.outbox.put_record("alert", a.fingerprint, a.to_dict(), now)
        self._changed_runs.add(a.run)
        g = self._groups.get(a.run)
        if a.status == "firing" and g is None:
            self._groups[a.run] = _Group(first_alert_at=now)
        elif a.status == "resolved" and before is not None and before.status == "firing" and g is not None:
            g.resolved_pending.add(a.fingerprint)

    def _group_alerts(self, run_id: str) -> list[Alert]:
        g = self._groups.get(run_id)
        pending = g.resolved_pending if g else set()
        return [a for a in self._alerts.values()
                if a.run == run_id and (a.status == "firing" or a.fingerprint in pending)]

    def _flush(self, run_id: str, now: float) -> list[str]:
        g = self._groups.get(run_id)
        if g is None:
            return []
        members = self._group_alerts(run_id)
        if not members:
            del self._groups[run_id]
            return []
        firing_members = [a for a in members if a.status == "firing"]
        timing = group_timing(firing_members or members, self.policy.timings)
        due = flush_due(g.first_alert_at, g.last_flush_at, timing, now)
        if not due and not g.resolved_pending:
            return []
        run_alerts = [a for a in self._alerts.values() if a.run == run_id]
        muted = inhibited(run_alerts, self.policy.inhibit_rules) | self._silences.muted(members, now)
        enqueued = []
        for sub in self._subscriptions.all():
            if sub.pass_through:
                continue  # see _pass_through
            mine = [a for a in members if sub.matches(a)]
            visible = [a for a in mine if a.fingerprint not in muted]
            firing = {a.fingerprint for a in visible if a.status == "firing"}
            resolved = {a.fingerprint for a in visible if a.status == "resolved"}
            key = (sub.id, run_id)
            entry = self._nflog.get(key)
            if not due and not (sub.send_resolved and resolution_due(entry, resolved, sub.resend_interval_s, now)):
                continue   # between group flushes, only a resolution the receiver waits for goes out
            reason = needs_update(
                entry, firing, resolved, timing.repeat_interval_s, now, sub.send_resolved,
                all_acknowledged=all(a.acknowledged_at is not None for a in visible if a.status == "firing"),
                muted_firing={a.fingerprint for a in mine if a.fingerprint in muted and a.status == "firing"},
            )
            if reason.should_notify:
                shown = [a for a in visible if a.status == "firing" or sub.send_resolved]
                enqueued += self._enqueue(sub, run_id, reason, shown, now)
                if firing:
                    self._resent_at[key] = now  # every visible firing alert was just sent
            if reason.updates_log:
                entry = NotificationLogEntry(frozenset(firing), frozenset(resolved), now)
                self._nflog[key] = entry
                self.outbox.put_record("nflog", f"{sub.id}|{run_id}", entry.to_dict(), now)
        if due:
            g.last_flush_at = now
            g.resolved_pending.clear()
            if not firing_members:
                del self._groups[run_id]
        return enqueued

    def _enqueue(self, sub: Subscription, run_id: str, reason: NotifyReason, alerts: list[Alert],
                 now: float) -> list[str]:
        """Render one notification for one subscription into the outbox (one row per body)."""
        alerts = sorted(alerts, key=lambda a: (-SEVERITY_ORDER[a.severity], a.starts_at, a.fingerprint))
        gkey = group_key(run_id)
        n = Notification(gkey, run_id, sub.receiver, reason, tuple(alerts), self.shown.external_url, now,
                         resend_interval_s=sub.resend_interval_s, routing_key=sub.routing_key,
                         runbook_url=self.shown.runbook_url)
        ids: list[str] = []
        handed: list[str] = []
        for i, body in enumerate(render_all(sub.format, n)):
            # The first row goes to the delivery worker with this job (claimed in it, sent once it
            # is durable) when the worker has room for it: no pass of its own to claim it.
            wid = new_webhook_id()
            hold = self._hand_off.reserve(sub.id, wid) if self._hand_off is not None and i == 0 else None
            ids.append(self.outbox.enqueue(sub.id, sub.delivery_url, sub.secret, body, now, group_key=gkey,
                                           reason=reason.value, webhook_id=wid, claim_s=hold))
            if hold is not None:
                handed.append(wid)
        self.counters.notifications[reason.value] = self.counters.notifications.get(reason.value, 0) + 1
        if ids:
            self._when_written(functools.partial(self._enqueued, handed))
        return ids

    def _enqueued(self, handed: list[str], durable: bool) -> None:
        """The job that enqueued deliveries ended: once durable, hand over those claimed in it
        for the delivery worker, and wake it for the rest; if it failed, give the reservations
        back (a sender held for a row never written would keep its subscription waiting)."""
        if self._hand_off is not None:
            for wid in handed:
                if durable:
                    self._hand_off.take(wid)
                else:
                    self._hand_off.release(wid)
        if durable and self._on_enqueue is not None:
            self._on_enqueue()

    def _when_written(self, callback: Callable[[bool], None]) -> None:
        """The notifier's one after-commit registration: ``callback(durable)`` runs once the
        job that writes the current change (the findings job, or a change's own) ended, told
        whether it is durable."""
        self.outbox.after_commit(callback)

    def _pass_through(self, now: float) -> list[str]:
        """Send pass-through subscriptions what changed in the runs touched since the last call:
        alerts that began firing, and alerts they were sent that resolved."""
        runs, self._changed_runs = self._changed_runs, set()
        subs = [s for s in self._subscriptions.all() if s.pass_through]
        enqueued: list[str] = []
        for run in runs if subs else ():
            alerts = [a for a in self._alerts.values() if a.run == run]
            for sub in subs:
                mine = [a for a in alerts if sub.matches(a)]
                key = (sub.id, run)
                entry = self._nflog.get(key)
                sent = entry.firing if entry is not None else frozenset()
                new = [a for a in mine if a.status == "firing" and a.fingerprint not in sent]
                ended = [a for a in mine if a.status == "resolved" and a.fingerprint in sent]
                if not new and not ended:
                    continue
                reason = (NotifyReason.FIRST_NOTIFICATION if entry is None else
                          NotifyReason.NEW_ALERTS_IN_GROUP if new else NotifyReason.NEW_RESOLVED_ALERTS)
                shown = new + (ended if sub.send_resolved else [])
                if shown:
                    enqueued += self._enqueue(sub, run, reason, shown, now)
                firing = frozenset(a.fingerprint for a in mine if a.status == "firing")
                entry = NotificationLogEntry(firing, frozenset(a.fingerprint for a in ended), now)
                self._nflog[key] = entry
                self.outbox.put_record("nflog", f"{sub.id}|{run}", entry.to_dict(), now)
                self._resent_at.setdefault(key, now)
        return enqueued

    def _resend(self, now: float) -> list[str]:
        """Re-send ``alertmanager_api`` receivers the firing alerts they were sent, every
        ``resend_interval_s``, each with a fresh ``endsAt`` ahead (formats.RESEND_LEAD)."""
        enqueued: list[str] = []
        for sub in self._subscriptions.all():
            if sub.format != "alertmanager_api":
                continue
            for key, entry in list(self._nflog.items()):
                if key[0] != sub.id or not entry.firing:
                    continue
                if now - self._resent_at.get(key, entry.sent_at) < sub.resend_interval_s:
                    continue
                self._resent_at[key] = now
                still = [self._alerts[fp] for fp in entry.firing
                         if fp in self._alerts and self._alerts[fp].status == "firing"]
                if still:
                    enqueued += self._enqueue(sub, key[1], NotifyReason.RESEND_INTERVAL_ELAPSED, still, now)
        return enqueued

    def _rebuild_groups(self, only: str | None = None) -> None:
        """After a restart (or a takeover of run ``only``): a run has a group while it has firing
        alerts, or while a receiver was last told something fires there (its resolution is still
        owed)."""
        last_sent: dict[str, float] = {}
        owed: set[str] = set()
        for (_, run), entry in self._nflog.items():
            if only is not None and run != only:
                continue
            last_sent[run] = max(last_sent.get(run, entry.sent_at), entry.sent_at)
            if entry.firing:
                owed.add(run)
        for a in self._alerts.values():
            if only is not None and a.run != only:
                continue
            if a.status == "firing" or a.run in owed:
                g = self._groups.setdefault(a.run, _Group(first_alert_at=a.starts_at, last_flush_at=last_sent.get(a.run)))
                g.first_alert_at = min(g.first_alert_at, a.starts_at)
        for a in self._alerts.values():
            held = self._groups.get(a.run) if only is None or a.run == only else None
            if (held is not None and a.status == "resolved"
                    and (held.last_flush_at is None or (a.ends_at or 0.0) > held.last_flush_at)):
                held.resolved_pending.add(a.fingerprint)


def _log_key(key: str) -> tuple[str, str]:
    """A notification log record's key, ``"<subscription>|<run>"``, as (subscription, run)."""
    sub, run = key.split("|", 1)
    return sub, run
