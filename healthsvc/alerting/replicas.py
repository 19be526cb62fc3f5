"""The alert manager with replicas: each replica's manager keeps the alerts of the runs its
replica owns (:mod:`healthsvc.ownership`), loads a run's when it takes the run over and
forgets them when it lets the run go (the store keeps them for the next owner).

A mixin of :class:`~healthsvc.alerting.manager.AlertManager` (its state and ``_owns``, the
replica's ``owns`` given to its constructor; ``None`` for a single server, which never calls these).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from healthsvc.alerting.admin import one_job
from healthsvc.alerting.model import Alert
from healthsvc.alerting.policy import NotificationLogEntry
from healthsvc.alerting.silences import Silences
from healthsvc.alerting.subscription import Subscription


class ReplicaAlerts:
    _lock: threading.RLock
    _owns: Callable[[str], bool] | None
    on_changed_elsewhere: Callable[[str], None] | None
    outbox: Any
    _alerts: dict[str, Alert]
    _nflog: dict[tuple[str, str], NotificationLogEntry]
    _silences: Silences
    _api_subs: dict[str, Subscription]
    _settings_subs: dict[str, Subscription]
    _groups: dict[str, Any]
    _rebuild_groups: Callable[..., None]   # the manager's
    _when_durable: Callable[[Callable[[], None]], None]   # the manager's
    _flush: Callable[[str, float], list[str]]   # the manager's
    _changed_runs: set[str]
    _resent_at: dict[tuple[str, str], float]

    @one_job
    def adopt_run(self, run_id: str, now: float | None = None) -> list[str]:
        """This replica took the run over: load its alerts and notification log as the previous
        owner left them (what it sent is not sent again), and the silences and API subscriptions
        as they are now (any replica may have changed them). One job: ordered with the findings
        jobs, so the run's next findings meet its loaded alerts.

        With ``now``, a group whose notification fell due while the run had no owner (the owner
        died between storing a finding and its group's flush) is sent here, before the findings
        of the run's restore are folded in: those may resolve it (the run finished meanwhile),
        and a group resolved before its first notification is never sent. Returns the webhook
        ids enqueued."""
        self.forget_run(run_id)
        for k, v in self.outbox.records("alert").items():
            if v.get("run") == run_id:
                self._alerts[k] = Alert.from_dict(v)
        for k, v in self.outbox.records("nflog").items():
            sub, run = k.split("|", 1)
            if run == run_id:
                self._nflog[(sub, run)] = NotificationLogEntry.from_dict(v)
        self._reload_shared()
        self._rebuild_groups(only=run_id)
        self._changed_runs.add(run_id)
        return self._flush(run_id, now) if now is not None else []

    def _tell_owner(self, run_id: str) -> None:
        """An operator changed an alert of a run another replica owns (the request reached this
        one): once it is stored, the owner reloads the run's alerts (``on_changed_elsewhere``)."""
        tell = self.on_changed_elsewhere
        if self._owns is None or self._owns(run_id) or tell is None:
            return
        self._when_durable(lambda: tell(run_id))

    def _reload_shared(self) -> None:
        """Replicas: silences and API subscriptions may be changed through any replica; the
        owner reads them again at every tick (two small reads), so a silence made elsewhere
        mutes its pages within a tick."""
        self._silences.reload(self.outbox.records("silence"))   # compiles only new or changed ones
        self._api_subs = {k: Subscription.from_dict(v) for k, v in self.outbox.records("subscription").items()
                          if k not in self._settings_subs}

    def runs_held(self) -> int:
        """Runs whose alerts this manager holds in memory (``/metrics``)."""
        with self._lock:
            return len({a.run for a in self._alerts.values()})

    def keeps_run(self, run_id: str) -> bool:
        """The run has a group (firing alerts, or a resolution still owed) or awaits its
        rollback target: its owner must keep it."""
        with self._lock:
            return run_id in self._groups or run_id in getattr(self, "awaiting_target", ())

    def forget_run(self, run_id: str) -> None:
        """Another replica owns the run now: keep nothing of it in memory (it is in the store)."""
        with self._lock:
            for fp in [fp for fp, a in self._alerts.items() if a.run == run_id]:
                del self._alerts[fp]
            for key in [k for k in self._nflog if k[1] == run_id]:
                del self._nflog[key]
                self._resent_at.pop(key, None)
            self._groups.pop(run_id, None)
            self._changed_runs.discard(run_id)
