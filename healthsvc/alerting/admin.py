"""What operators manage beside the notify pipeline: silences, API subscriptions, and the
queries behind ``GET /v1/alerts`` (a mixin of :class:`~healthsvc.alerting.manager.AlertManager`,
whose state and lock it shares; every write is durable when the call returns).

Errors::

    AlertingError
    ├── NotFound
    └── ReadOnly
"""
from __future__ import annotations

import functools
import threading
from dataclasses import replace
from typing import Any, Callable, Iterable, TypeVar

from healthsvc_detectors.finding import SEVERITY_ORDER

from healthsvc.alerting.model import Alert
from healthsvc.alerting.policy import Matcher, NotificationLogEntry, PolicyConfig, Silence, inhibited
from healthsvc.alerting.silences import Silences
from healthsvc.alerting.signing import generate_message_id
from healthsvc.alerting.subscription import Subscription
from healthsvc.store.outbox import Outbox


F = TypeVar("F", bound=Callable[..., Any])


def one_job(method: F) -> F:
    """Run a method that changes the manager's state as ONE store job, holding the manager's lock
    inside it (:meth:`~healthsvc.store.outbox.Outbox.run_in_job`): what it changes in memory and
    the rows that record it happen together, on the writer thread; the findings job, which folds
    new findings into alerts in the same transaction that stores them, runs there too, so no
    thread ever waits for the writer while holding the lock the writer needs."""
    @functools.wraps(method)
    def in_job(self, *args: Any, **kwargs: Any) -> Any:
        def body() -> Any:
            with self._lock:
                return method(self, *args, **kwargs)
        return self.outbox.transaction(body)
    return in_job  # type: ignore[return-value]


class AlertingError(Exception):
    """Root of the alerting package's errors."""


class NotFound(AlertingError):
    """No alert, silence or subscription with that id."""


class ReadOnly(AlertingError):
    """Subscriptions from settings cannot be changed through the API."""


class AlertAdmin:
    """Silences, subscriptions and alert queries over the manager's state."""

    outbox: Outbox
    policy: PolicyConfig
    _lock: threading.RLock
    _alerts: dict[str, Alert]
    _silences: Silences
    _settings_subs: dict[str, Subscription]
    _api_subs: dict[str, Subscription]
    _nflog: dict[tuple[str, str], NotificationLogEntry]
    _resent_at: dict[tuple[str, str], float]

    # -- silences -----------------------------------------------------------------------------

    @one_job
    def add_silence(self, matchers: Iterable[Matcher], starts_at: float, ends_at: float, now: float,
                    created_by: str = "", comment: str = "") -> Silence:
        s = Silence("sil_" + generate_message_id()[4:], tuple(matchers), starts_at, ends_at, created_by, comment)
        self._silences.check_room(now, self.policy.max_silences)
        self._silences.put(s)
        self.outbox.put_record("silence", s.id, s.to_dict(), now)
        return s

    @one_job
    def expire_silence(self, silence_id: str, now: float) -> Silence:
        """End a silence now (kept, listed as expired)."""
        s = self._silences.get(silence_id)
        if s is None:
            raise NotFound(f"no silence {silence_id!r}")
        if s.ends_at > now:
            s = Silence(s.id, s.matchers, min(s.starts_at, now - 1e-3), now, s.created_by, s.comment)
            self._silences.put(s)
            self.outbox.put_record("silence", s.id, s.to_dict(), now)
        return s

    def silences(self) -> list[Silence]:
        with self._lock:
            return sorted(self._silences.values(), key=lambda s: s.starts_at)

    # -- subscriptions ------------------------------------------------------------------------

    def subscriptions(self) -> list[Subscription]:
        with self._lock:
            return [*self._settings_subs.values(), *self._api_subs.values()]

    def subscription(self, sub_id: str) -> Subscription:
        with self._lock:
            s = self._settings_subs.get(sub_id) or self._api_subs.get(sub_id)
        if s is None:
            raise NotFound(f"no subscription {sub_id!r}")
        return s

    @one_job
    def put_subscription(self, sub: Subscription, now: float) -> Subscription:
        """Create or replace an API subscription."""
        if sub.id in self._settings_subs:
            raise ReadOnly(f"subscription {sub.id!r} comes from settings; change it there")
        sub = replace(sub, source="api")
        self._api_subs[sub.id] = sub
        self.outbox.put_record("subscription", sub.id, sub.to_record(), now)
        return sub

    @one_job
    def delete_subscription(self, sub_id: str, now: float) -> int:
        """Delete an API subscription; its pending deliveries are cancelled (count returned)."""
        if sub_id in self._settings_subs:
            raise ReadOnly(f"subscription {sub_id!r} comes from settings; remove it there")
        if self._api_subs.pop(sub_id, None) is None:
            raise NotFound(f"no subscription {sub_id!r}")
        self.outbox.delete_record("subscription", sub_id)
        for key in [k for k in self._nflog if k[0] == sub_id]:
            del self._nflog[key]
            self._resent_at.pop(key, None)
            self.outbox.delete_record("nflog", "|".join(key))
        return self.outbox.cancel_pending(sub_id, now)

    # -- queries ------------------------------------------------------------------------------

    def _known_alerts(self) -> dict[str, Alert]:
        """Every alert: this manager's own; with replicas (``_owns``), also those of the runs
        other replicas own, as they stored them (any replica answers any read)."""
        if getattr(self, "_owns", None) is None:
            return self._alerts
        known = {k: Alert.from_dict(v) for k, v in self.outbox.records("alert").items()}
        known.update(self._alerts)
        return known

    def alerts(self, *, run: str | None = None, kind: str | None = None, status: str | None = None,
               min_severity: str | None = None, acknowledged: bool | None = None) -> list[Alert]:
        """Alerts, newest first, filtered by every argument that is set."""
        with self._lock:
            out = [a for a in self._known_alerts().values()
                   if (run is None or a.run == run) and (kind is None or a.kind == kind)
                   and (status is None or a.status == status)
                   and (min_severity is None or SEVERITY_ORDER[a.severity] >= SEVERITY_ORDER[min_severity])
                   and (acknowledged is None or (a.acknowledged_at is not None) == acknowledged)]
        return sorted(out, key=lambda a: a.starts_at, reverse=True)

    def alert(self, fp: str) -> Alert:
        with self._lock:
            return self._get(fp)

    def muting(self, alerts: Iterable[Alert], now: float) -> dict[str, dict[str, Any]]:
        """For each alert: ``{"silenced_by": [silence ids], "inhibited": bool}``."""
        with self._lock:
            alerts = list(alerts)
            inhibited_fps: set[str] = set()
            known = self._known_alerts()
            for run in {a.run for a in alerts}:
                inhibited_fps |= inhibited([a for a in known.values() if a.run == run],
                                           self.policy.inhibit_rules)
            return {a.fingerprint: {
                "silenced_by": self._silences.matching(a.routing_labels(), now),
                "inhibited": a.fingerprint in inhibited_fps,
            } for a in alerts}

    def _get(self, fp: str) -> Alert:
        a = self._alerts.get(fp) or self._known_alerts().get(fp)
        if a is None:
            raise NotFound(f"no alert with fingerprint {fp!r}")
        return a
