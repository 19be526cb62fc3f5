"""Run health: what is firing in a run. The one answer ``GET /v1/runs/{run_id}``, ``/metrics`` and
the dashboard read.

A stored finding is *active* while

- no later finding of the same condition resolved it (:meth:`FindingsService.unresolved`), and
- its alert (:func:`healthsvc.identity.alert_fingerprint`, the function alerting folds it by) has not been resolved
  since the finding was stored: by hand (``POST /v1/alerts/{fp}/resolve``), by a rollback past
  its onset, or by its condition staying clear for ``alert_resolve_timeout_s``.

Acknowledging an alert keeps its findings active (the condition is still there) and says so:
each active finding carries its alert's ``fingerprint``, ``status`` and acknowledgement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from healthsvc_detectors.finding import SEVERITY_ORDER
from healthsvc.findings import FindingsService, StoredFinding
from healthsvc.identity import alert_fingerprint


class AlertState(Protocol):
    """What run health reads of an alert (``healthsvc.alerting.model.Alert`` has it)."""
    fingerprint: str
    labels: tuple[tuple[str, str], ...]
    ranks: tuple[int, ...]
    status: str
    starts_at: float
    ends_at: float | None
    acknowledged_at: float | None
    acknowledged_by: str | None


# run_id -> the run's alerts by fingerprint (empty while alerting is not running).
AlertStates = Callable[[str], Mapping[str, AlertState]]


@dataclass(frozen=True)
class ActiveFinding:
    stored: StoredFinding
    alert: AlertState | None          # None: alerting keeps no alert for it (yet)

    def to_dict(self) -> dict[str, Any]:
        d = self.stored.to_dict()
        a = self.alert
        d["alert"] = None if a is None else {
            "fingerprint": a.fingerprint, "status": a.status,
            "acknowledged_at": a.acknowledged_at, "acknowledged_by": a.acknowledged_by}
        return d


class RunHealth:
    def __init__(self, findings: FindingsService, alert_states: AlertStates | None = None) -> None:
        self.findings = findings
        self.alert_states = alert_states

    def active(self, run_id: str) -> list[ActiveFinding]:
        alerts = self.alert_states(run_id) if self.alert_states is not None else {}
        out = []
        for sf in self.findings.unresolved(run_id):
            a = alerts.get(alert_fingerprint(run_id, sf.finding, alerts.values(), at=sf.created_at))
            if a is not None and a.status == "resolved" and a.ends_at is not None and a.ends_at >= sf.created_at:
                continue  # resolved after this finding was stored (a later one re-opens it)
            out.append(ActiveFinding(sf, a))
        return out

    def summary(self, run_id: str) -> dict[str, Any]:
        """The run-summary section: health at a glance and the active findings."""
        active = self.active(run_id)
        worst = max((SEVERITY_ORDER[af.stored.finding.severity] for af in active), default=-1)
        health = "ok" if worst <= 0 else ("warning" if worst == 1 else "critical")
        return {"health": health, "findings_by_kind": self.findings.firing_counts(run_id),
                "active_findings": [af.to_dict() for af in active]}
