"""What an alert is: labels, fingerprint and lifecycle (after Prometheus Alertmanager).

An alert is identified by its *identity labels* ``alertname`` (the finding kind), ``run``,
``rank`` and ``metric`` (absent when the finding names none). ``rank`` names the blamed rank set
(:func:`healthsvc.identity.rank_label`): the rank when a finding blames exactly one, its ranges
when it blames several, ``"*"`` when it is run-wide. A NaN on 512 ranks is ONE alert
``rank="0-511"``, whose ``ranks`` annotation lists them. A finding joins a firing alert of the
same kind/metric that already blames some of its ranks, whose blamed ranks grow to the union (the
fault spreading keeps its alert and its identity); a disjoint rank set is a second alert (a
second fault). Which alert a finding belongs to is :func:`healthsvc.identity.alert_fingerprint`'s
to say.

The ``severity`` label is carried for receivers that route on it (Alertmanager routes usually
do) but is *not* part of the identity: a spike that escalates from warning to critical stays the
same alert. The fingerprint is the first 16 hex digits of SHA-256 over the sorted identity labels.

Lifecycle (all times are unix seconds from the caller; nothing here reads a clock):

- a firing finding opens the alert (``starts_at``) or refreshes it (``last_seen_at``); a firing
  finding for a resolved alert re-opens it with a new ``starts_at``;
- how a kind resolves is its own (``Kind.resolves`` in :mod:`healthsvc_detectors.kinds`): *latched* kinds
  (``non_finite``, ``rank_outlier``, ``divergence``, the exact checks: corruption) stay firing
  until :func:`resolve_by_hand` or a rollback (:func:`resolve_by_hand` with ``by="rollback"``);
- *condition* kinds resolve when a ``status="resolved"`` finding says their condition cleared, at
  once (the receiver is told within one re-send interval: a one-step spike that recovers is not
  left firing for minutes), or ``resolve_timeout_s`` after their last firing finding when no
  resolved finding comes (no re-fire); *explicit* kinds (``hang``, ``stall``) only resolve on a
  resolved finding, because a silent rank does not come back by the service forgetting about it.
  An alert of a kind no longer declared (stored before its detector was removed) resolves as a
  condition kind.

Example::

    >>> from healthsvc_detectors.finding import Finding
    >>> a = fire(None, Finding("loss_spike", step=120, metric="loss", ranks=(3,)), "r1", ("h3",),
    ...          now=100.0)
    >>> a.label_dict["rank"], a.status, a.hosts
    ('3', 'firing', ('h3',))
    >>> expire(a, now=100.0 + 300.0, policy=LifecyclePolicy()).status
    'resolved'
    >>> clear(a, now=101.0).ends_at, clear(a, now=101.0).resolved_by
    (101.0, 'condition')
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping, Sequence
from urllib.parse import quote

import numpy as np

from healthsvc_detectors.finding import SEVERITY_ORDER, Finding
from healthsvc_detectors import kinds as kind_table
# The identity (labels and fingerprint) is healthsvc.identity's; re-exported for alerting's callers.
from healthsvc.identity import ALL_RANKS, IDENTITY_LABELS, compact_ranks, condition_labels, fingerprint  # noqa: F401
from healthsvc.alerting.runbook import describe_kind, runbook_section


def _resolves(kind_name: str) -> str:
    return kind_table.kind(kind_name).resolves if kind_table.known(kind_name) else "condition"


def is_latched(kind_name: str) -> bool:
    """An alert of this kind stays firing until resolved by hand or by a rollback (corruption)."""
    return _resolves(kind_name) == "latched"

# Who resolved an alert: the service itself ("condition": it cleared; "rollback": a rollback
# past its onset) or the person named in POST .../resolve ("by"), "hand" when they gave no name.
SERVICE_RESOLVERS: frozenset[str] = frozenset({"condition", "rollback"})


@dataclass(frozen=True)
class LifecyclePolicy:
    """How alerts resolve. ``resolve_timeout_s``: seconds a condition must stay clear."""

    resolve_timeout_s: float = 300.0


def alert_labels(finding: Finding, run_id: str) -> dict[str, str]:
    """Identity labels of the alert a finding belongs to (see module docstring and
    :mod:`healthsvc.identity`, which owns them)."""
    return condition_labels(finding, run_id)


@dataclass(frozen=True)
class Alert:
    """One alert. ``ends_at is None`` while firing; times are unix seconds.

    ``ranks`` is the union of ranks blamed by the findings folded into the alert; ``hosts`` the
    hosts of those ranks that were known, each once, in the order blamed (at most ``MAX_HOSTS``). ``annotations`` are strings, as in Alertmanager.
    """

    labels: tuple[tuple[str, str], ...]
    fingerprint: str
    severity: str
    starts_at: float
    last_seen_at: float
    first_step: int
    last_step: int
    onset_step: int | None = None
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    summary: str = ""
    score: float = 0.0
    latched: bool = False
    ends_at: float | None = None
    cleared_at: float | None = None
    resolved_by: str | None = None
    acknowledged_at: float | None = None
    acknowledged_by: str | None = None
    rollback_target: dict[str, Any] | None = field(default=None, compare=False)
    evidence: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def kind(self) -> str:
        return self.label_dict["alertname"]

    @property
    def run(self) -> str:
        return self.label_dict["run"]

    @property
    def status(self) -> Literal["firing", "resolved"]:
        return "firing" if self.ends_at is None else "resolved"

    def routing_labels(self) -> dict[str, str]:
        """Labels as receivers see them: identity labels plus ``severity``."""
        return {**self.label_dict, "severity": self.severity}

    def annotations(self, external_url: str = "", runbook_url: str = "") -> dict[str, str]:
        """Human part of the alert, all strings (Alertmanager's annotations are string maps).
        ``runbook_url``: the runbook's base URL; the alert links its kind's section."""
        ann = {
            "summary": self.summary,
            "description": describe(self),
            "first_step": str(self.first_step),
            "last_step": str(self.last_step),
            "score": f"{self.score:.3f}",
        }
        if self.onset_step is not None:
            ann["onset_step"] = str(self.onset_step)
        if self.ranks:
            ann["ranks"] = compact_ranks(self.ranks)
            ann["rank_count"] = str(len(self.ranks))
        if self.hosts:
            ann["hosts"] = ",".join(self.hosts[:16]) + ("" if len(self.hosts) <= 16 else ",...")
        if self.rollback_target:
            step, uri = self.rollback_target.get("step"), self.rollback_target.get("uri")
            ann["rollback_target"] = f"step {step}" + (f" ({uri})" if uri else "")
        if self.acknowledged_at is not None:
            ann["acknowledged_by"] = self.acknowledged_by or ""
        if self.resolved_by is not None:
            ann["resolved_by"] = self.resolved_by
        if external_url:
            ann["run_url"] = run_url(external_url, self.run)
        if runbook_url:
            ann["runbook_url"] = runbook_section(runbook_url, self.kind)
        return ann

    def to_dict(self, external_url: str = "", runbook_url: str = "") -> dict[str, Any]:
        """Our own JSON form (the ``json`` webhook format and the API)."""
        return {
            "fingerprint": self.fingerprint,
            "status": self.status,
            "labels": self.routing_labels(),
            "annotations": self.annotations(external_url, runbook_url),
            "kind": self.kind,
            "run": self.run,
            "severity": self.severity,
            "ranks": list(self.ranks),
            "hosts": list(self.hosts),
            "first_step": self.first_step,
            "last_step": self.last_step,
            "onset_step": self.onset_step,
            "score": self.score,
            "latched": self.latched,
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "last_seen_at": self.last_seen_at,
            "cleared_at": self.cleared_at,
            "resolved_by": self.resolved_by,
            "acknowledged_at": self.acknowledged_at,
            "acknowledged_by": self.acknowledged_by,
            "rollback_target": self.rollback_target,
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Alert":
        identity = {k: v for k, v in d["labels"].items() if k in IDENTITY_LABELS}
        return cls(
            labels=tuple(sorted(identity.items())), fingerprint=d["fingerprint"],
            severity=d["severity"], starts_at=d["starts_at"], last_seen_at=d["last_seen_at"],
            first_step=d["first_step"], last_step=d["last_step"], onset_step=d.get("onset_step"),
            ranks=tuple(d.get("ranks", ())), hosts=tuple(d.get("hosts", ())),
            summary=d["annotations"].get("summary", ""), score=d.get("score", 0.0),
            latched=d.get("latched", False), ends_at=d.get("ends_at"),
            cleared_at=d.get("cleared_at"), resolved_by=d.get("resolved_by"),
            acknowledged_at=d.get("acknowledged_at"), acknowledged_by=d.get("acknowledged_by"),
            rollback_target=d.get("rollback_target"), evidence=dict(d.get("evidence") or {}),
        )


def run_url(external_url: str, run_id: str) -> str:
    """The dashboard's page of a run (what a person opens from a page), not its JSON.

    >>> run_url("http://svc:8080/", "exp 1")
    'http://svc:8080/runs/exp%201'
    """
    return f"{external_url.rstrip('/')}/runs/{quote(run_id, safe='')}"


def describe(a: Alert) -> str:
    """The ``description`` annotation: what happened where (the summary), what the alert name
    means (the runbook's sentence), and where to resume when a corruption alert knows it."""
    text = f"{a.summary[:1].upper()}{a.summary[1:]}. {describe_kind(a.kind)}" if a.summary else describe_kind(a.kind)
    if a.rollback_target and a.rollback_target.get("step") is not None:
        uri = a.rollback_target.get("uri")
        text += f" Resume from the checkpoint at step {a.rollback_target['step']}" + (f" ({uri})." if uri else ".")
    return text


def summarize(finding: Finding, run_id: str, ranks: np.ndarray) -> str:
    """One line for a pager: what, where, since when."""
    what = finding.kind.replace("_", " ")
    metric = f" in {finding.metric}" if finding.metric else ""
    if ranks.size == 0:
        where = "run-wide"
    elif ranks.size == 1:
        where = f"on rank {int(ranks[0])}"
    else:
        where = f"on {ranks.size} ranks ({compact_ranks(ranks)[:60]})"
    return f"{what}{metric} {where} of run {run_id} since step {finding.step}"


def fire(
    existing: Alert | None,
    finding: Finding,
    run_id: str,
    hosts: Sequence[str | None],
    now: float,
    policy: LifecyclePolicy = LifecyclePolicy(),
) -> Alert:
    """Fold a firing finding into its alert (opening or re-opening it when needed). ``hosts``: the
    host of each rank the finding blames, None where unknown (as the finding was stored)."""
    labels = alert_labels(finding, run_id)
    new_ranks = np.asarray(finding.ranks, dtype=np.int64)
    if existing is None or existing.status == "resolved":   # (re)open
        ranks = np.unique(new_ranks)
        return Alert(
            labels=tuple(sorted(labels.items())), fingerprint=fingerprint(labels),
            severity=finding.severity, starts_at=now, last_seen_at=now,
            first_step=finding.step, last_step=finding.step, onset_step=finding.onset_step,
            ranks=tuple(ranks.tolist()), hosts=_known_hosts((), hosts),
            summary=summarize(finding, run_id, ranks), score=finding.score,
            latched=is_latched(finding.kind),
            rollback_target=existing.rollback_target if existing else None,
            evidence=dict(finding.evidence),
        )
    ranks = np.union1d(np.asarray(existing.ranks, dtype=np.int64), new_ranks)
    severity = max(existing.severity, finding.severity, key=SEVERITY_ORDER.__getitem__)
    onset = [s for s in (existing.onset_step, finding.onset_step) if s is not None]
    first_step = min(existing.first_step, finding.step)
    summary = existing.summary if ranks.size == len(existing.ranks) else summarize(
        replace(finding, step=first_step), run_id, ranks)
    return replace(
        existing, severity=severity, last_seen_at=max(existing.last_seen_at, now),
        first_step=first_step, last_step=max(existing.last_step, finding.step),
        onset_step=min(onset) if onset else None, ranks=tuple(ranks.tolist()),
        hosts=_known_hosts(existing.hosts, hosts), summary=summary,
        score=max(existing.score, finding.score), cleared_at=None,
    )


def clear(existing: Alert, now: float) -> Alert:
    """A ``status="resolved"`` finding: the condition cleared at ``now``, so the alert resolves
    now; latched alerts (corruption) stay firing, their condition noted as cleared."""
    if existing.status == "resolved":
        return existing
    # Findings are timed by when their input arrived, and one a tick raised (now) can be folded
    # before one raised by a push that arrived just earlier: an alert never ends before it began.
    now = max(now, existing.starts_at)
    if existing.latched:
        return replace(existing, cleared_at=now)
    return replace(existing, cleared_at=now, ends_at=now, resolved_by="condition")


def expire(alert: Alert, now: float, policy: LifecyclePolicy) -> Alert:
    """Resolve a non-latched alert no finding was folded into for ``resolve_timeout_s``.

    ``ends_at`` is the moment the timeout elapsed, not ``now``, so the result does not depend on
    how often the caller ticks.
    """
    if alert.status == "resolved" or alert.latched:
        return alert
    if alert.cleared_at is not None:   # cleared and firing: stored by a version that waited
        clear_since = alert.cleared_at
    elif _resolves(alert.kind) == "explicit":
        return alert
    else:
        clear_since = alert.last_seen_at
    ends_at = clear_since + policy.resolve_timeout_s
    if now < ends_at:
        return alert
    return replace(alert, ends_at=ends_at, resolved_by="condition")


def resolve_by_hand(alert: Alert, now: float, by: str = "") -> Alert:
    """Resolve now, latched or not: ``by`` is who (an operator's name; ``"rollback"`` for a
    rollback past the corruption; empty: ``"hand"``)."""
    if alert.status == "resolved":
        return alert
    return replace(alert, ends_at=now, resolved_by=by or "hand")


def acknowledge(alert: Alert, now: float, by: str) -> Alert:
    """Someone is on it: shown in bodies, and repeat notifications stop (see policy)."""
    return replace(alert, acknowledged_at=now, acknowledged_by=by)


MAX_HOSTS = 256   # hosts an alert keeps: blamed ranks can be thousands; a page names a few


def _known_hosts(known: Sequence[str], more: Sequence[str | None]) -> tuple[str, ...]:
    """``known`` followed by the hosts of ``more`` not in it yet (None skipped), at most MAX_HOSTS.

    >>> _known_hosts(("a",), ("b", None, "a", "c"))
    ('a', 'b', 'c')
    """
    seen = dict.fromkeys(known)
    for h in more:
        if len(seen) >= MAX_HOSTS:
            break
        if h is not None:
            seen.setdefault(h, None)
    return tuple(seen)
