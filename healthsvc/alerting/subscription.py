"""Webhook subscriptions: where notifications go, in which body format, for which alerts.

A subscription matches an alert when every filter that is set agrees: ``runs`` (run ids),
``kinds`` (alert names) and ``min_severity``. Empty filters match everything.

Example::

    >>> s = Subscription(id="oncall", url="http://127.0.0.1:9093/api/v2/alerts", format="alertmanager",
    ...                  min_severity="critical")
    >>> s.receiver
    'oncall'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from detectors.finding import FINDING_KINDS, SEVERITY_ORDER

from healthsvc.alerting.model import Alert

BodyFormat = Literal["alertmanager", "slack", "json"]
BODY_FORMATS: tuple[str, ...] = ("alertmanager", "slack", "json")


@dataclass(frozen=True)
class Subscription:
    """A webhook receiver. ``secret`` is a Standard Webhooks ``whsec_<base64>`` key (or empty:
    bodies are then sent unsigned). ``source`` says where it came from: ``settings`` or ``api``."""

    id: str
    url: str
    format: BodyFormat = "json"
    runs: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    min_severity: str = "info"
    secret: str = ""
    name: str = ""
    source: Literal["settings", "api"] = "api"
    send_resolved: bool = True

    def __post_init__(self) -> None:
        if self.format not in BODY_FORMATS:
            raise ValueError(f"format must be one of {BODY_FORMATS}; got {self.format!r}")
        if self.min_severity not in SEVERITY_ORDER:
            raise ValueError(f"min_severity must be one of {tuple(SEVERITY_ORDER)}; got {self.min_severity!r}")
        unknown = set(self.kinds) - set(FINDING_KINDS)
        if unknown:
            raise ValueError(f"unknown kinds {sorted(unknown)}; expected some of {FINDING_KINDS}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be http(s); got {self.url!r}")
        if self.secret and not self.secret.startswith("whsec_"):
            raise ValueError("secret must look like 'whsec_<base64>' (see signing.generate_secret())")

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
        return {
            "id": self.id, "url": self.url, "format": self.format, "runs": list(self.runs),
            "kinds": list(self.kinds), "min_severity": self.min_severity,
            "secret": self.secret if reveal_secret else ("whsec_***" if self.secret else ""),
            "name": self.name, "source": self.source, "send_resolved": self.send_resolved,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Subscription":
        return cls(
            id=d["id"], url=d["url"], format=d.get("format", "json"),
            runs=tuple(d.get("runs") or ()), kinds=tuple(d.get("kinds") or ()),
            min_severity=d.get("min_severity", "info"), secret=d.get("secret", ""),
            name=d.get("name", ""), source=d.get("source", "api"),
            send_resolved=bool(d.get("send_resolved", True)),
        )
