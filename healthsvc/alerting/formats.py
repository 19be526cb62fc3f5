"""Webhook bodies: ``alertmanager`` (the v4 webhook body), ``slack`` (incoming webhook) and
``json`` (our own alert objects).

The Alertmanager v4 body (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config)::

    {"version": "4", "groupKey": "{}:{run=\\"r1\\"}", "truncatedAlerts": 0, "status": "firing",
     "receiver": "oncall", "groupLabels": {"run": "r1"}, "commonLabels": {...},
     "commonAnnotations": {...}, "externalURL": "http://healthsvc:8080",
     "alerts": [{"status": "firing", "labels": {...}, "annotations": {...},
                 "startsAt": "2024-05-01T12:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                 "generatorURL": "http://healthsvc:8080/runs/r1?kind=non_finite&step=120",
                 "fingerprint": "3f2a..."}]}

A firing alert's ``endsAt`` is Go's zero time, as Alertmanager sends it.
"""
from __future__ import annotations


import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable
from urllib.parse import quote

from healthsvc.alerting.model import Alert
from healthsvc.alerting.policy import NotifyReason
from healthsvc.encode import jsonable

GO_ZERO_TIME = "0001-01-01T00:00:00Z"
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
    alerts = [
        {
            "status": a.status,
            "labels": a.routing_labels(),
            "annotations": a.annotations(n.external_url),
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
        ann = a.annotations(n.external_url)
        lines = [f"*{a.kind}* ({a.severity}, {a.status}) {ann['summary']}"]
        details = [f"first step {ann['first_step']}"]
        for key in ("onset_step", "ranks", "hosts", "rollback_target"):
            if key in ann:
                details.append(f"{key.replace('_', ' ')}: {ann[key]}")
        if n.external_url:
            details.append(f"<{generator_url(n.external_url, a)}|open>")
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
        "alerts": [a.to_dict(n.external_url) for a in n.alerts],
    }


FORMATS: dict[str, Callable[[Notification], dict[str, Any]]] = {
    "alertmanager": alertmanager_body,
    "slack": slack_body,
    "json": json_body,
}


def render(fmt: str, n: Notification) -> bytes:
    """Body bytes of a notification in a format. Non-finite floats in evidence become the wire
    strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (JSON has no NaN)."""
    try:
        build = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown body format {fmt!r}; expected one of {tuple(FORMATS)}") from None
    return json.dumps(jsonable(build(n)), separators=(",", ":"), allow_nan=False).encode()


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    common = dict(maps[0])
    for m in maps[1:]:
        common = {k: v for k, v in common.items() if m.get(k) == v}
    return common
