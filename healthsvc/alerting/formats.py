"""Webhook bodies: ``alertmanager`` (the v4 webhook body), ``slack`` (incoming webhook),
``json`` (our own alert objects), ``alertmanager_api`` (postable alerts for an Alertmanager's
``POST /api/v2/alerts``) and ``pagerduty`` (Events API v2, one event per alert).

The Alertmanager v4 body (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config)::

    {"version": "4", "groupKey": "{}:{run=\\"r1\\"}", "truncatedAlerts": 0, "status": "firing",
     "receiver": "oncall", "groupLabels": {"run": "r1"}, "commonLabels": {...},
     "commonAnnotations": {...}, "externalURL": "http://healthsvc:8080",
     "alerts": [{"status": "firing", "labels": {...}, "annotations": {...},
                 "startsAt": "2024-05-01T12:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                 "generatorURL": "http://healthsvc:8080/runs/r1?kind=non_finite&step=120",
                 "fingerprint": "3f2a..."}]}

A firing alert's ``endsAt`` is Go's zero time, as Alertmanager sends it.

``alertmanager_api`` is what Prometheus sends (https://prometheus.io/docs/alerting/latest/clients/):
a list of ``{"labels", "annotations", "startsAt", "endsAt", "generatorURL"}``. A firing alert's
``endsAt`` is ``RESEND_LEAD`` re-send intervals ahead of the post (Prometheus uses 4 too), so an
Alertmanager keeps it firing between re-sends whatever its ``resolve_timeout``, and lets it lapse
if healthsvc goes away; a resolved alert's ``endsAt`` is when it resolved (now, or just before).

``pagerduty``: ``event_action`` is ``trigger`` (firing), ``acknowledge`` (firing, acknowledged
here) or ``resolve``; ``dedup_key`` is the alert's fingerprint, so PagerDuty folds every event of
one alert into one incident; severities map as ``critical -> critical``, ``warning -> warning``,
``info -> info`` (``error`` is not used). Validated against ``tests/alerting/pagerduty_event.schema.json``.
"""
from __future__ import annotations


import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable
from urllib.parse import quote

from healthsvc.alerting.model import ALL_RANKS, Alert, run_url
from healthsvc.alerting.policy import NotifyReason
from healthsvc.encode import jsonable

GO_ZERO_TIME = "0001-01-01T00:00:00Z"
RESEND_LEAD = 4  # a firing alert's endsAt is this many re-send intervals ahead
PAGERDUTY_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}
MAX_SLACK_ALERTS = 10  # Slack caps a message at 50 blocks; a page needs the first few anyway.


@dataclass(frozen=True)
class Notification:
    """One notification of one group to one subscription, before it is rendered."""

    group_key: str
    run: str
    receiver: str
    reason: NotifyReason
    alerts: tuple[Alert, ...]
    external_url: str
    created_at: float
    resend_interval_s: float = 60.0   # alertmanager_api: sets how far ahead a firing endsAt is
    routing_key: str = ""             # pagerduty: the integration key written into each event
    runbook_url: str = ""             # the runbook's base URL: each alert links its kind's section

    @property
    def status(self) -> str:
        return "firing" if any(a.status == "firing" for a in self.alerts) else "resolved"


def rfc3339(ts: float) -> str:
    """Unix seconds to RFC 3339 UTC with milliseconds: ``0 -> "1970-01-01T00:00:00.000Z"``."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def generator_url(external_url: str, alert: Alert) -> str:
    """The dashboard's run page, opened at the alert's finding (its kind, at its first step)."""
    return f"{external_url.rstrip('/')}/runs/{quote(alert.run, safe='')}?kind={alert.kind}&step={alert.first_step}"


def alertmanager_body(n: Notification) -> dict[str, Any]:
    alerts: list[dict[str, Any]] = [
        {
            "status": a.status,
            "labels": a.routing_labels(),
            "annotations": a.annotations(n.external_url, n.runbook_url),
            "startsAt": rfc3339(a.starts_at),
            "endsAt": GO_ZERO_TIME if a.ends_at is None else rfc3339(a.ends_at),
            "generatorURL": generator_url(n.external_url, a),
            "fingerprint": a.fingerprint,
        }
        for a in n.alerts
    ]
    return {
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": 0,
        "status": n.status,
        "receiver": n.receiver,
        "groupLabels": {"run": n.run},
        "commonLabels": _common([a["labels"] for a in alerts]),
        "commonAnnotations": _common([a["annotations"] for a in alerts]),
        "externalURL": n.external_url,
        "alerts": alerts,
    }


def slack_body(n: Notification) -> dict[str, Any]:
    firing = [a for a in n.alerts if a.status == "firing"]
    resolved = [a for a in n.alerts if a.status == "resolved"]
    worst = "critical" if any(a.severity == "critical" for a in firing) else (
        "warning" if firing else "resolved")
    icon = {"critical": ":rotating_light:", "warning": ":warning:", "resolved": ":white_check_mark:"}[worst]
    title = f"{icon} [{n.status.upper()}:{len(firing) or len(resolved)}] run {n.run}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": True}},
    ]
    for a in list(firing)[:MAX_SLACK_ALERTS] + list(resolved)[:MAX_SLACK_ALERTS]:
        ann = a.annotations(n.external_url, n.runbook_url)
        lines = [f"*{a.kind}* ({a.severity}, {a.status}) {ann['summary']}"]
        details = [f"first step {ann['first_step']}"]
        for key in ("onset_step", "ranks", "hosts", "rollback_target"):
            if key in ann:
                details.append(f"{key.replace('_', ' ')}: {ann[key]}")
        if n.external_url:
            details.append(f"<{generator_url(n.external_url, a)}|open>")
        if "runbook_url" in ann:
            details.append(f"<{ann['runbook_url']}|runbook>")
        lines.append(" · ".join(details))
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:3000]}})
    shown = min(len(firing), MAX_SLACK_ALERTS) + min(len(resolved), MAX_SLACK_ALERTS)
    if shown < len(n.alerts):
        blocks.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": f"and {len(n.alerts) - shown} more"}]})
    if n.external_url:
        blocks.append({"type": "section", "text": {
            "type": "mrkdwn", "text": f"<{n.external_url.rstrip('/')}/runs/{quote(n.run, safe='')}|Open run {n.run}>"}})
    text = f"{title}: " + "; ".join(a.summary for a in (firing or resolved)[:3])
    return {"text": text, "blocks": blocks}


def json_body(n: Notification) -> dict[str, Any]:
    return {
        "version": "1",
        "group_key": n.group_key,
        "run": n.run,
        "receiver": n.receiver,
        "status": n.status,
        "reason": n.reason.value,
        "created_at": n.created_at,
        "alerts": [a.to_dict(n.external_url, n.runbook_url) for a in n.alerts],
    }


def alertmanager_api_body(n: Notification) -> list[dict[str, Any]]:
    ahead = rfc3339(n.created_at + RESEND_LEAD * n.resend_interval_s)
    return [
        {
            "labels": a.routing_labels(),
            "annotations": a.annotations(n.external_url, n.runbook_url),
            "startsAt": rfc3339(a.starts_at),
            "endsAt": ahead if a.ends_at is None else rfc3339(min(a.ends_at, n.created_at)),
            "generatorURL": generator_url(n.external_url, a),
        }
        for a in n.alerts
    ]


def pagerduty_event(n: Notification, a: Alert) -> dict[str, Any]:
    """One Events API v2 event for one alert."""
    if a.status == "resolved":
        action = "resolve"
    else:
        action = "trigger" if a.acknowledged_at is None else "acknowledge"
    event: dict[str, Any] = {"routing_key": n.routing_key, "event_action": action, "dedup_key": a.fingerprint}
    if action == "trigger":
        ann = a.annotations(n.external_url, n.runbook_url)
        labels = a.label_dict
        event["payload"] = {
            "summary": (a.summary or f"{a.kind} in run {a.run}")[:1024],
            "source": a.hosts[0] if len(a.hosts) == 1 else f"run {a.run}",
            "severity": PAGERDUTY_SEVERITY[a.severity],
            "timestamp": rfc3339(a.starts_at),
            "component": _component(labels["rank"]),
            "group": a.run,
            "class": a.kind,
            "custom_details": {**ann, "labels": a.routing_labels()},
        }
        event["client"] = "healthsvc"
        event["client_url"] = run_url(n.external_url, a.run)
        event["links"] = [{"href": generator_url(n.external_url, a), "text": f"{a.kind} findings of run {a.run}"}]
        if "runbook_url" in ann:
            event["links"].append({"href": ann["runbook_url"], "text": f"runbook: {a.kind}"})
    return event


def pagerduty_bodies(n: Notification) -> list[dict[str, Any]]:
    return [pagerduty_event(n, a) for a in n.alerts]


FORMATS: dict[str, Callable[[Notification], Any]] = {
    "alertmanager": alertmanager_body,
    "slack": slack_body,
    "json": json_body,
    "alertmanager_api": alertmanager_api_body,
}
# Formats whose receiver takes one item per request: a notification becomes one body per alert.
PER_ALERT_FORMATS: dict[str, Callable[[Notification], list[Any]]] = {
    "pagerduty": pagerduty_bodies,
}


def _dump(doc: Any) -> bytes:
    return json.dumps(jsonable(doc), separators=(",", ":"), allow_nan=False).encode()


def render(fmt: str, n: Notification) -> bytes:
    """Body bytes of a notification in a format. Non-finite floats in evidence become the wire
    strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (JSON has no NaN)."""
    try:
        build = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown body format {fmt!r}; expected one of {tuple(FORMATS)}") from None
    return _dump(build(n))


def render_all(fmt: str, n: Notification) -> list[bytes]:
    """The request bodies of a notification: one, or one per alert for ``PER_ALERT_FORMATS``."""
    if fmt in PER_ALERT_FORMATS:
        return [_dump(doc) for doc in PER_ALERT_FORMATS[fmt](n)]
    return [render(fmt, n)]


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    common = dict(maps[0])
    for m in maps[1:]:
        common = {k: v for k, v in common.items() if m.get(k) == v}
    return common


def _component(rank: str) -> str:
    """PagerDuty's component for an alert's rank label.

    >>> _component("3"), _component("0-511"), _component("*")
    ('rank 3', 'ranks 0-511', 'all ranks')
    """
    if rank == ALL_RANKS:
        return "all ranks"
    return f"rank {rank}" if rank.isdigit() else f"ranks {rank}"
