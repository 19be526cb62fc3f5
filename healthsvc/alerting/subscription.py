"""Webhook subscriptions: where notifications go, in which body format, for which alerts.

A subscription matches an alert when every filter that is set agrees: ``runs`` (run ids),
``kinds`` (alert names) and ``min_severity``. Empty filters match everything. Info never pages:
a subscription that does not say its ``min_severity`` gets ``warning`` in the formats that reach
people (:data:`PAGING_FORMATS`: Alertmanager, Slack, PagerDuty), ``info`` in ``json`` (a program's
feed of everything).

Formats (``formats``): ``alertmanager`` (the v4 webhook body Alertmanager sends), ``slack``,
``json``, ``alertmanager_api`` (``url`` is an Alertmanager; its ``/api/v2/alerts`` is fed postable
alerts, firing ones re-sent every ``resend_interval_s``; in every format a resolution is sent
within ``resend_interval_s``) and ``pagerduty`` (Events API v2; one
event per alert, ``routing_key`` required).

``pass_through``: post every alert change at once, with no grouping, inhibition or silences on
our side (for an Alertmanager that does those itself). ``headers`` (extra request headers) and
``bearer_token`` (``Authorization: Bearer ...``) go on every attempt; they, ``routing_key`` and
``secret`` are secrets: ``to_dict`` hides their values unless asked.

Example::

    >>> s = Subscription(id="oncall", url="http://127.0.0.1:9093/api/v2/alerts", format="alertmanager",
    ...                  min_severity="critical")
    >>> s.receiver
    'oncall'
    >>> Subscription(id="chat", url="https://hooks.slack.com/services/T/B/X", format="slack").min_severity
    'warning'
    >>> Subscription(id="am", url="http://127.0.0.1:9093", format="alertmanager_api").delivery_url
    'http://127.0.0.1:9093/api/v2/alerts'
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from healthsvc_detectors import kinds as kind_table
from healthsvc_detectors.finding import SEVERITY_ORDER

from healthsvc.alerting.model import Alert

BodyFormat = Literal["alertmanager", "slack", "json", "alertmanager_api", "pagerduty"]
BODY_FORMATS: tuple[str, ...] = ("alertmanager", "slack", "json", "alertmanager_api", "pagerduty")
# Formats whose receivers page or notify people: info findings stay out unless asked for.
PAGING_FORMATS: frozenset[str] = frozenset({"alertmanager", "slack", "alertmanager_api", "pagerduty"})
AM_ALERTS_PATH = "/api/v2/alerts"
HIDDEN = "***"
# Headers the delivery sets itself; a subscription may not replace them.
RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "user-agent", "webhook-id",
                              "webhook-timestamp", "webhook-signature", "transfer-encoding", "connection"})
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")


def default_min_severity(fmt: str) -> str:
    """``warning`` for the formats that page (info never pages), ``info`` for ``json``."""
    return "warning" if fmt in PAGING_FORMATS else "info"


@dataclass(frozen=True)
class Subscription:
    """A webhook receiver. ``secret`` is a Standard Webhooks ``whsec_<base64>`` key (or empty:
    bodies are then sent unsigned). ``source`` says where it came from: ``settings`` or ``api``."""

    id: str
    url: str
    format: BodyFormat = "json"
    runs: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    min_severity: str = ""            # empty: default_min_severity(format)
    secret: str = ""
    name: str = ""
    source: Literal["settings", "api"] = "api"
    send_resolved: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    bearer_token: str = ""
    pass_through: bool = False
    resend_interval_s: float = 60.0
    routing_key: str = ""

    def __post_init__(self) -> None:
        if self.format not in BODY_FORMATS:
            raise ValueError(f"format must be one of {BODY_FORMATS}; got {self.format!r}")
        if not self.min_severity:
            object.__setattr__(self, "min_severity", default_min_severity(self.format))
        if self.min_severity not in SEVERITY_ORDER:
            raise ValueError(f"min_severity must be one of {tuple(SEVERITY_ORDER)}; got {self.min_severity!r}")
        unknown = sorted(k for k in self.kinds if not kind_table.known(k))
        if unknown:
            raise ValueError(f"unknown kinds {unknown}; expected some of {kind_table.names()}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be http(s); got {self.url!r}")
        if self.secret and not self.secret.startswith("whsec_"):
            raise ValueError("secret must look like 'whsec_<base64>' (see signing.generate_secret())")
        for name, value in self.headers:
            if not _HEADER_NAME.match(name):
                raise ValueError(f"headers: {name!r} is not a valid header name")
            if name.lower() in RESERVED_HEADERS or (name.lower() == "authorization" and self.bearer_token):
                raise ValueError(f"headers: {name!r} is set by the delivery itself; it cannot be given")
            if "\r" in value or "\n" in value:
                raise ValueError(f"headers: the value of {name!r} contains a line break")
        if "\r" in self.bearer_token or "\n" in self.bearer_token:
            raise ValueError("bearer_token contains a line break")
        if not 1.0 <= self.resend_interval_s <= 3600.0:
            raise ValueError(f"resend_interval_s must be between 1 and 3600 seconds; got {self.resend_interval_s!r}")
        if self.format == "pagerduty" and len(self.routing_key) != 32:
            raise ValueError("format 'pagerduty' needs routing_key, the 32-character integration key of a "
                             "PagerDuty service (Events API v2)")

    @property
    def delivery_url(self) -> str:
        """Where bodies are POSTed: ``url``, or an Alertmanager's alerts endpoint under it."""
        if self.format == "alertmanager_api" and not self.url.rstrip("/").endswith(AM_ALERTS_PATH):
            return self.url.rstrip("/") + AM_ALERTS_PATH
        return self.url

    def request_headers(self) -> dict[str, str]:
        """The subscription's own headers for every attempt (custom ones, then the bearer token)."""
        out = dict(self.headers)
        if self.bearer_token:
            out["Authorization"] = f"Bearer {self.bearer_token}"
        return out

    @property
    def receiver(self) -> str:
        """The receiver name written into bodies (Alertmanager's ``receiver``)."""
        return self.name or self.id

    def matches(self, alert: Alert) -> bool:
        if self.runs and alert.run not in self.runs:
            return False
        if self.kinds and alert.kind not in self.kinds:
            return False
        return SEVERITY_ORDER[alert.severity] >= SEVERITY_ORDER[self.min_severity]

    def to_dict(self, reveal_secret: bool = False) -> dict[str, Any]:
        """The API view: ``secret`` in full only with ``reveal_secret`` (once, when generated);
        the credentials a user gave (header values, ``bearer_token``, ``routing_key``) as ``***``."""
        return self._dict(reveal_secret, reveal_credentials=False)

    def to_record(self) -> dict[str, Any]:
        """Everything, for the store (``from_dict`` reads it back)."""
        return self._dict(True, reveal_credentials=True)

    def _dict(self, reveal_secret: bool, reveal_credentials: bool) -> dict[str, Any]:
        def hide(value: str) -> str:
            return value if reveal_credentials or not value else HIDDEN
        return {
            "id": self.id, "url": self.url, "format": self.format, "runs": list(self.runs),
            "kinds": list(self.kinds), "min_severity": self.min_severity,
            "secret": self.secret if reveal_secret else ("whsec_***" if self.secret else ""),
            "name": self.name, "source": self.source, "send_resolved": self.send_resolved,
            "headers": {k: hide(v) for k, v in self.headers}, "bearer_token": hide(self.bearer_token),
            "pass_through": self.pass_through, "resend_interval_s": self.resend_interval_s,
            "routing_key": hide(self.routing_key),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Subscription":
        return cls(
            id=d["id"], url=d["url"], format=d.get("format", "json"),
            runs=tuple(d.get("runs") or ()), kinds=tuple(d.get("kinds") or ()),
            min_severity=d.get("min_severity") or "", secret=d.get("secret", ""),
            name=d.get("name", ""), source=d.get("source", "api"),
            send_resolved=bool(d.get("send_resolved", True)),
            headers=tuple((str(k), str(v)) for k, v in (d.get("headers") or {}).items()),
            bearer_token=d.get("bearer_token", ""), pass_through=bool(d.get("pass_through", False)),
            resend_interval_s=float(d.get("resend_interval_s", 60.0)), routing_key=d.get("routing_key", ""),
        )
