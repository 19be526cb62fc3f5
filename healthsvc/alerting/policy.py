"""The notification policy, as pure functions of state and time (after Alertmanager).

- **Grouping**: alerts are grouped by run; one notification carries a whole group. The group key
  has Alertmanager's shape, ``{}:{run="r1"}``.
- **Timing** (:class:`Timing`, defaults per severity in :data:`DEFAULT_TIMINGS`): a new group is
  first flushed ``group_wait_s`` after its first alert (0 for critical: it goes out at once), then
  at most every ``group_interval_s`` when it changes, and re-sent every ``repeat_interval_s`` while
  unchanged and firing. A group is timed by its most severe alert. A resolution of an alert a
  receiver was told fires does not wait for the group interval: it goes out within the
  subscription's ``resend_interval_s`` (:func:`resolution_due`).
- **Dedup**: :func:`needs_update` decides, from what the receiver was last sent and what is firing
  and resolved now, whether to notify, and returns a named :class:`NotifyReason`.
- **Inhibition**: a firing source alert mutes target alerts of the same run
  (:func:`kind_inhibit_rules`, from each kind's ``mutes`` in :mod:`healthsvc_detectors.kinds`:
  ``non_finite`` mutes the spikes and divergence it explains; ``stall`` mutes the ``hang`` and
  ``straggler`` alerts it explains).
- **Silences**: label matchers (``=``, ``!=``, ``=~``, ``!~``) with a start and an expiry
  (:mod:`healthsvc.alerting.silences`).

Example::

    >>> needs_update(None, firing={"a1"}, resolved=set(), repeat_interval_s=3600, now=0.0)
    <NotifyReason.FIRST_NOTIFICATION: 'first_notification'>
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from healthsvc_detectors.finding import SEVERITY_ORDER
from healthsvc_detectors import kinds as kind_table

from healthsvc.alerting.model import Alert
# Silences are healthsvc.alerting.silences'; re-exported for the policy's callers.
from healthsvc.alerting.silences import (DEFAULT_MAX_SILENCES, MAX_PATTERN_CHARS, Matcher, MatchOp,  # noqa: F401
                                         Silence, compile_pattern, silenced)


class NotifyReason(str, enum.Enum):
    """Why a group is (or is not) notified; mirrors Alertmanager's ``NotifyReason``."""

    DO_NOT_NOTIFY = "do_not_notify"
    FIRST_NOTIFICATION = "first_notification"
    NEW_ALERTS_IN_GROUP = "new_alerts_in_group"
    ALL_ALERTS_RESOLVED = "all_alerts_resolved"
    NEW_RESOLVED_ALERTS = "new_resolved_alerts"
    REPEAT_INTERVAL_ELAPSED = "repeat_interval_elapsed"
    # Everything the receiver was shown is still firing but now muted (silenced or inhibited):
    # nothing is sent, the log forgets them, so they are notified again if the mute ends.
    ALL_ALERTS_MUTED = "all_alerts_muted"
    # Not Alertmanager's: an ``alertmanager_api`` receiver is re-sent its firing alerts every
    # ``resend_interval_s``, or it would resolve them after its own resolve_timeout.
    RESEND_INTERVAL_ELAPSED = "resend_interval_elapsed"
    # Not Alertmanager's: an acknowledgement is forwarded to receivers that track it (PagerDuty).
    ACKNOWLEDGED = "acknowledged"

    @property
    def should_notify(self) -> bool:
        return self not in (NotifyReason.DO_NOT_NOTIFY, NotifyReason.ALL_ALERTS_MUTED)

    @property
    def updates_log(self) -> bool:
        return self is not NotifyReason.DO_NOT_NOTIFY


@dataclass(frozen=True)
class NotificationLogEntry:
    """What one subscription was last sent for one group, and when (unix seconds)."""

    firing: frozenset[str]
    resolved: frozenset[str]
    sent_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"firing": sorted(self.firing), "resolved": sorted(self.resolved), "sent_at": self.sent_at}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "NotificationLogEntry":
        return cls(frozenset(d["firing"]), frozenset(d["resolved"]), float(d["sent_at"]))


def needs_update(
    entry: NotificationLogEntry | None,
    firing: set[str] | frozenset[str],
    resolved: set[str] | frozenset[str],
    repeat_interval_s: float,
    now: float,
    send_resolved: bool = True,
    all_acknowledged: bool = False,
    muted_firing: set[str] | frozenset[str] = frozenset(),
) -> NotifyReason:
    """Decide whether a group must be notified (Alertmanager's ``DedupStage.needsUpdate``).

    ``firing``/``resolved`` are the fingerprints the subscription would be shown now (muted ones
    left out); ``muted_firing`` the ones still firing but muted. ``all_acknowledged``: every
    firing alert is acknowledged, so the repeat reminder is skipped (changes still notify).
    """
    if entry is None:
        return NotifyReason.FIRST_NOTIFICATION if firing else NotifyReason.DO_NOT_NOTIFY
    if not set(firing) <= entry.firing:
        # After a notification that resolved everything, a new firing starts a new sequence.
        return NotifyReason.NEW_ALERTS_IN_GROUP if entry.firing else NotifyReason.FIRST_NOTIFICATION
    if not firing:
        # Alerts that fired and resolved between two flushes were never shown: nothing to say.
        if not entry.firing:
            return NotifyReason.DO_NOT_NOTIFY
        if entry.firing <= set(muted_firing):
            return NotifyReason.ALL_ALERTS_MUTED
        return NotifyReason.ALL_ALERTS_RESOLVED
    if send_resolved and not set(resolved) <= entry.resolved:
        return NotifyReason.NEW_RESOLVED_ALERTS
    if not all_acknowledged and entry.sent_at <= now - repeat_interval_s:
        return NotifyReason.REPEAT_INTERVAL_ELAPSED
    return NotifyReason.DO_NOT_NOTIFY


@dataclass(frozen=True)
class Timing:
    """Group timing, seconds. ``group_wait_s=0`` sends the first notification at once."""

    group_wait_s: float
    group_interval_s: float
    repeat_interval_s: float


DEFAULT_TIMINGS: dict[str, Timing] = {
    "critical": Timing(group_wait_s=0.0, group_interval_s=10.0, repeat_interval_s=3600.0),
    "warning": Timing(group_wait_s=30.0, group_interval_s=300.0, repeat_interval_s=4 * 3600.0),
    "info": Timing(group_wait_s=60.0, group_interval_s=600.0, repeat_interval_s=24 * 3600.0),
}


def group_key(run_id: str) -> str:
    """Alertmanager-shaped group key of a run: ``{}:{run="r1"}``."""
    escaped = run_id.replace("\\", "\\\\").replace('"', '\\"')
    return '{}:{run="' + escaped + '"}'


def group_timing(alerts: Iterable[Alert], timings: Mapping[str, Timing] = DEFAULT_TIMINGS) -> Timing:
    """Timing of the most severe alert in the group (warning's when the group is empty)."""
    worst = max((a.severity for a in alerts), key=SEVERITY_ORDER.__getitem__, default="warning")
    return timings[worst]


def flush_due(first_alert_at: float, last_flush_at: float | None, timing: Timing, now: float) -> bool:
    """Is the group's next flush due? First after ``group_wait_s``, then every ``group_interval_s``."""
    if last_flush_at is None:
        return now >= first_alert_at + timing.group_wait_s
    return now >= last_flush_at + timing.group_interval_s


def resolution_due(entry: NotificationLogEntry | None, resolved: set[str] | frozenset[str],
                   resend_interval_s: float, now: float) -> bool:
    """Must a receiver hear now, between group flushes, that alerts it was told fire resolved?

    Yes once ``resend_interval_s`` passed since its last notification: a resolution reaches it
    within one re-send interval (a warning group's interval is minutes; an alert left firing
    that long at a receiver pages and holds incidents open for nothing), and a run whose alerts
    flap notifies at most once per interval.

    >>> e = NotificationLogEntry(frozenset({"a1"}), frozenset(), sent_at=100.0)
    >>> resolution_due(e, {"a1"}, 60.0, now=130.0), resolution_due(e, {"a1"}, 60.0, now=160.0)
    (False, True)
    """
    return entry is not None and bool(entry.firing & set(resolved)) and now >= entry.sent_at + resend_interval_s


def next_flush_at(first_alert_at: float, last_flush_at: float | None, timing: Timing) -> float:
    if last_flush_at is None:
        return first_alert_at + timing.group_wait_s
    return last_flush_at + timing.group_interval_s


# ---------------------------------------------------------------------------------------------
# Inhibition

@dataclass(frozen=True)
class InhibitRule:
    """A firing alert named in ``source_kinds`` mutes alerts in ``target_kinds`` that agree with
    it on every label in ``equal`` (by default: the same run)."""

    source_kinds: frozenset[str]
    target_kinds: frozenset[str]
    equal: tuple[str, ...] = ("run",)


def kind_inhibit_rules() -> tuple[InhibitRule, ...]:
    """One rule per kind that mutes others (``Kind.mutes``), within its run.

    >>> from healthsvc_detectors.registry import REGISTRY
    >>> [(sorted(r.source_kinds), sorted(r.target_kinds)) for r in kind_inhibit_rules()]
    [(['non_finite'], ['divergence', 'grad_spike', 'loss_spike']), (['stall'], ['hang', 'straggler'])]
    """
    return tuple(InhibitRule(frozenset({k.name}), k.mutes) for k in kind_table.kinds() if k.mutes)


def inhibited(alerts: Iterable[Alert], rules: Iterable[InhibitRule] | None = None) -> set[str]:
    """Fingerprints of the alerts muted by a firing source alert (by default under the kinds'
    own rules)."""
    alerts = list(alerts)
    rules = kind_inhibit_rules() if rules is None else rules
    muted: set[str] = set()
    for rule in rules:
        sources = {
            tuple(a.label_dict.get(k, "") for k in rule.equal)
            for a in alerts if a.status == "firing" and a.kind in rule.source_kinds
        }
        if not sources:
            continue
        for a in alerts:
            if a.kind in rule.target_kinds and tuple(a.label_dict.get(k, "") for k in rule.equal) in sources:
                muted.add(a.fingerprint)
    return muted


@dataclass(frozen=True)
class PolicyConfig:
    """Everything the notification policy needs; defaults are the documented ones."""

    timings: Mapping[str, Timing] = field(default_factory=lambda: dict(DEFAULT_TIMINGS))
    inhibit_rules: tuple[InhibitRule, ...] = field(default_factory=kind_inhibit_rules)
    max_silences: int = DEFAULT_MAX_SILENCES   # active or pending at once (see silences)
