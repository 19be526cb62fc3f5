"""What operators manage beside the notify pipeline: the silences (:class:`SilenceBook`) and the
subscriptions (:class:`Subscriptions`), each the one owner of its state and of its rows in the
outbox's record table. :class:`~healthsvc.alerting.manager.AlertManager` holds one of each, calls
them under its lock with their writes collected into the change's job, and hands them to the notify pipeline
(:class:`~healthsvc.alerting.notifier.Notifier`), which reads them where it decides.

Errors::

    AlertingError
    ├── NotFound
    └── ReadOnly
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping

from healthsvc.alerting.model import Alert
from healthsvc.alerting.policy import Matcher, Silence
from healthsvc.alerting.silences import Silences
from healthsvc.alerting.signing import generate_message_id
from healthsvc.alerting.subscription import Subscription
from healthsvc.store.outbox import Outbox


class AlertingError(Exception):
    """Root of the alerting package's errors."""


class NotFound(AlertingError):
    """No alert, silence or subscription with that id."""


class ReadOnly(AlertingError):
    """Subscriptions from settings cannot be changed through the API."""


class SilenceBook:
    """The silences: kept in memory (compiled, indexed: :class:`~healthsvc.alerting.silences.Silences`)
    and as records. Not thread-safe: its holder serialises the calls."""

    def __init__(self, outbox: Outbox, max_silences: int) -> None:
        self._outbox = outbox
        self._max = max_silences
        self._silences = Silences()
        self.reload()

    def __len__(self) -> int:
        return len(self._silences)

    def reload(self) -> None:
        """Read the stored silences again (another replica may have changed them); compiles only
        new or changed ones."""
        self._silences.reload(self._outbox.records("silence"))

    def add(self, matchers: Iterable[Matcher], starts_at: float, ends_at: float, now: float,
            created_by: str = "", comment: str = "") -> Silence:
        s = Silence("sil_" + generate_message_id()[4:], tuple(matchers), starts_at, ends_at, created_by, comment)
        self._silences.check_room(now, self._max)
        self._silences.put(s)
        self._outbox.put_record("silence", s.id, s.to_dict(), now)
        return s

    def expire(self, silence_id: str, now: float) -> Silence:
        """End a silence now (kept, listed as expired)."""
        s = self._silences.get(silence_id)
        if s is None:
            raise NotFound(f"no silence {silence_id!r}")
        if s.ends_at > now:
            s = Silence(s.id, s.matchers, min(s.starts_at, now - 1e-3), now, s.created_by, s.comment)
            self._silences.put(s)
            self._outbox.put_record("silence", s.id, s.to_dict(), now)
        return s

    def all(self) -> list[Silence]:
        return sorted(self._silences.values(), key=lambda s: s.starts_at)

    def matching(self, labels: Mapping[str, str], now: float) -> list[str]:
        return self._silences.matching(labels, now)

    def muted(self, alerts: Iterable[Alert], now: float) -> set[str]:
        return self._silences.muted(alerts, now)


class Subscriptions:
    """The subscriptions: those from settings (read only) and those made through the API (kept as
    records). Not thread-safe: its holder serialises the calls."""

    def __init__(self, outbox: Outbox, from_settings: Iterable[Subscription]) -> None:
        self._outbox = outbox
        self._settings = {s.id: s for s in from_settings}
        self._api = {k: Subscription.from_dict(v) for k, v in outbox.records("subscription").items()}
        clash = set(self._settings) & set(self._api)
        if clash:
            raise AlertingError(f"subscription ids {sorted(clash)} exist in settings and via the API")

    def reload(self) -> None:
        """Read the API subscriptions again (another replica may have changed them)."""
        self._api = {k: Subscription.from_dict(v) for k, v in self._outbox.records("subscription").items()
                     if k not in self._settings}

    def all(self) -> list[Subscription]:
        return [*self._settings.values(), *self._api.values()]

    def get(self, sub_id: str) -> Subscription:
        s = self._settings.get(sub_id) or self._api.get(sub_id)
        if s is None:
            raise NotFound(f"no subscription {sub_id!r}")
        return s

    def put(self, sub: Subscription, now: float) -> Subscription:
        """Create or replace an API subscription."""
        if sub.id in self._settings:
            raise ReadOnly(f"subscription {sub.id!r} comes from settings; change it there")
        sub = replace(sub, source="api")
        self._api[sub.id] = sub
        self._outbox.put_record("subscription", sub.id, sub.to_record(), now)
        return sub

    def delete(self, sub_id: str) -> None:
        """Delete an API subscription (its deliveries and log entries are its holder's to drop)."""
        if sub_id in self._settings:
            raise ReadOnly(f"subscription {sub_id!r} comes from settings; remove it there")
        if self._api.pop(sub_id, None) is None:
            raise NotFound(f"no subscription {sub_id!r}")
        self._outbox.delete_record("subscription", sub_id)
