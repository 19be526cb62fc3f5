"""HTTP API of alerting: ``/v1/alerts``, ``/v1/silences``, ``/v1/webhooks``.

Handlers are sync (FastAPI runs them in its threadpool) because the manager's writes wait for the
store's group commit. Each handler is a few lines over :class:`~healthsvc.alerting.AlertManager`.
"""
from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field

from detectors.finding import FINDING_KINDS
from healthsvc.alerting import manager as mgr
from healthsvc.alerting.manager import AlertManager
from healthsvc.alerting.policy import Matcher
from healthsvc.alerting.signing import generate_secret
from healthsvc.alerting.subscription import Subscription
from healthsvc.errors import Conflict, InvalidInput, NotFound

router = APIRouter(prefix="/v1", tags=["alerting"])

Kind = Literal[FINDING_KINDS]  # type: ignore[valid-type]
SeverityName = Literal["info", "warning", "critical"]


def _service(request: Request):
    return request.app.state.alerting


def _manager(request: Request) -> AlertManager:
    m = request.app.state.alerting.manager
    if m is None:
        raise Conflict("alerting is not started yet", hint="retry once /readyz answers 200")
    return m


def _now(request: Request) -> float:
    return request.app.state.ctx.clock()


def _domain(exc: Exception, loc: tuple = ()) -> Exception:
    if isinstance(exc, mgr.NotFound):
        return NotFound(str(exc), loc=loc)
    if isinstance(exc, mgr.ReadOnly):
        return Conflict(str(exc), loc=loc, hint="settings subscriptions come from HEALTHSVC_ALERT_WEBHOOKS")
    return InvalidInput(str(exc), loc=loc)


# -- alerts -------------------------------------------------------------------------------------

class Actor(BaseModel):
    by: str = Field("", max_length=200, description="Who did it (shown in notifications).")


def _alert_view(m: AlertManager, alerts: list, now: float, external_url: str) -> list[dict[str, Any]]:
    muting = m.muting(alerts, now)
    return [{**a.to_dict(external_url), **muting[a.fingerprint]} for a in alerts]


@router.get("/alerts", summary="Alerts, newest first")
def list_alerts(
    request: Request,
    run: Annotated[str | None, Query(description="Only this run.")] = None,
    kind: Annotated[Kind | None, Query(description="Only this alert name (finding kind).")] = None,
    status: Annotated[Literal["firing", "resolved"] | None, Query()] = None,
    min_severity: Annotated[SeverityName | None, Query()] = None,
    acknowledged: Annotated[bool | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> dict[str, Any]:
    m = _manager(request)
    alerts = m.alerts(run=run, kind=kind, status=status, min_severity=min_severity, acknowledged=acknowledged)[:limit]
    return {"alerts": _alert_view(m, alerts, _now(request), m.external_url)}


@router.get("/alerts/{fingerprint}", summary="One alert")
def get_alert(fingerprint: str, request: Request) -> dict[str, Any]:
    m = _manager(request)
    try:
        a = m.alert(fingerprint)
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "fingerprint")) from None
    return _alert_view(m, [a], _now(request), m.external_url)[0]


@router.post("/alerts/{fingerprint}/acknowledge", summary="Someone is on it: stops repeat notifications")
def acknowledge_alert(fingerprint: str, body: Actor, request: Request) -> dict[str, Any]:
    m = _manager(request)
    try:
        a = m.acknowledge(fingerprint, body.by, _now(request))
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "fingerprint")) from None
    return a.to_dict(m.external_url)


@router.post("/alerts/{fingerprint}/resolve", summary="Resolve by hand (latched alerts too)")
def resolve_alert(fingerprint: str, body: Actor, request: Request) -> dict[str, Any]:
    m = _manager(request)
    try:
        a = m.resolve(fingerprint, body.by, _now(request))
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "fingerprint")) from None
    return a.to_dict(m.external_url)


# -- silences -----------------------------------------------------------------------------------

class MatcherIn(BaseModel):
    name: str = Field(..., description="Label name: alertname, run, rank, metric or severity.")
    value: str
    op: Literal["=", "!=", "=~", "!~"] = "="


class SilenceIn(BaseModel):
    matchers: list[MatcherIn] = Field(..., min_length=1)
    starts_at: float | None = Field(None, description="Unix seconds; default now.")
    ends_at: float | None = Field(None, description="Unix seconds; or give duration_s.")
    duration_s: float | None = Field(None, gt=0, description="Length from starts_at, seconds.")
    created_by: str = ""
    comment: str = ""


@router.get("/silences", summary="Silences (active, pending and expired)")
def list_silences(request: Request) -> dict[str, Any]:
    now = _now(request)
    return {"silences": [s.to_dict(now) for s in _manager(request).silences()]}


@router.post("/silences", status_code=201, summary="Mute notifications of matching alerts until an expiry")
def create_silence(body: SilenceIn, request: Request) -> dict[str, Any]:
    now = _now(request)
    starts = body.starts_at if body.starts_at is not None else now
    if (body.ends_at is None) == (body.duration_s is None):
        raise InvalidInput("give exactly one of ends_at or duration_s", loc=("body",))
    ends = body.ends_at if body.ends_at is not None else starts + float(body.duration_s)
    try:
        s = _manager(request).add_silence([Matcher(m.name, m.value, m.op) for m in body.matchers], starts, ends,
                                          now, body.created_by, body.comment)
    except Exception as exc:  # ValueError from matcher/silence validation, re.error for bad regexes
        raise InvalidInput(str(exc), loc=("body",)) from None
    return s.to_dict(now)


@router.delete("/silences/{silence_id}", summary="Expire a silence now")
def expire_silence(silence_id: str, request: Request) -> dict[str, Any]:
    now = _now(request)
    try:
        return _manager(request).expire_silence(silence_id, now).to_dict(now)
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "silence_id")) from None


# -- webhooks -----------------------------------------------------------------------------------

class WebhookIn(BaseModel):
    url: str = Field(..., description="http(s) URL the body is POSTed to.")
    format: Literal["alertmanager", "slack", "json"] = "json"
    runs: list[str] = Field(default_factory=list, description="Only these runs (empty: all).")
    kinds: list[Kind] = Field(default_factory=list, description="Only these alert names (empty: all).")  # type: ignore[valid-type]
    min_severity: SeverityName = "info"
    secret: str | None = Field(None, description="whsec_<base64>; omitted: one is generated and returned once;"
                                                 " empty string: bodies are sent unsigned.")
    name: str = Field("", description="Receiver name written into bodies (default: the id).")
    send_resolved: bool = True


class WebhookCreate(WebhookIn):
    id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$", description="Default: generated.")


def _subscription_view(request: Request, s: Subscription, reveal: bool = False) -> dict[str, Any]:
    return {**s.to_dict(reveal_secret=reveal), "deliveries": _service(request).outbox.state_counts(s.id)}


def _put(request: Request, sub_id: str, body: WebhookIn, existing: Subscription | None) -> dict[str, Any]:
    secret = body.secret
    generated = secret is None and existing is None
    if secret is None:
        secret = existing.secret if existing is not None else generate_secret()
    try:
        sub = Subscription(id=sub_id, url=body.url, format=body.format, runs=tuple(body.runs),
                           kinds=tuple(body.kinds), min_severity=body.min_severity, secret=secret,
                           name=body.name, send_resolved=body.send_resolved)
        sub = _manager(request).put_subscription(sub, _now(request))
    except (ValueError, mgr.AlertingError) as exc:
        raise _domain(exc, ("body",)) from None
    return _subscription_view(request, sub, reveal=generated)


@router.get("/webhooks", summary="Webhook subscriptions (settings and API), with delivery counts")
def list_webhooks(request: Request) -> dict[str, Any]:
    return {"webhooks": [_subscription_view(request, s) for s in _manager(request).subscriptions()]}


@router.post("/webhooks", status_code=201, summary="Add a webhook subscription (a generated secret is shown once)")
def create_webhook(body: WebhookCreate, request: Request) -> dict[str, Any]:
    sub_id = body.id or "wh_" + secrets.token_hex(6)
    m = _manager(request)
    if any(s.id == sub_id for s in m.subscriptions()):
        raise Conflict(f"webhook {sub_id!r} exists", loc=("body", "id"), hint=f"PUT /v1/webhooks/{sub_id} replaces it")
    return _put(request, sub_id, body, None)


@router.get("/webhooks/{sub_id}", summary="One subscription with its delivery counts")
def get_webhook(sub_id: str, request: Request) -> dict[str, Any]:
    try:
        return _subscription_view(request, _manager(request).subscription(sub_id))
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "sub_id")) from None


@router.put("/webhooks/{sub_id}", summary="Create or replace a subscription (secret kept when omitted)")
def put_webhook(sub_id: str, body: WebhookIn, request: Request) -> dict[str, Any]:
    try:
        existing = _manager(request).subscription(sub_id)
    except mgr.NotFound:
        existing = None
    return _put(request, sub_id, body, existing)


@router.delete("/webhooks/{sub_id}", summary="Delete a subscription; its pending deliveries are cancelled")
def delete_webhook(sub_id: str, request: Request) -> dict[str, Any]:
    try:
        return {"cancelled": _manager(request).delete_subscription(sub_id, _now(request))}
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "sub_id")) from None


@router.get("/webhooks/{sub_id}/deliveries", summary="Delivery status: counts and recent deliveries")
def list_deliveries(
    sub_id: str, request: Request,
    state: Annotated[Literal["pending", "delivered", "failed", "dead", "cancelled"] | None,
                     Query(description="Only this state; dead = the dead letters.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> dict[str, Any]:
    outbox = _service(request).outbox
    return {"subscription_id": sub_id, "counts": outbox.state_counts(sub_id),
            "deliveries": [d.to_dict() for d in outbox.deliveries(sub_id, state, limit)]}


@router.post("/webhooks/{sub_id}/deliveries/{webhook_id}/redeliver", summary="Queue a dead or failed delivery again")
def redeliver(sub_id: str, webhook_id: str, request: Request) -> Response:
    service = _service(request)
    d = service.outbox.get(webhook_id)
    if d is None or d.subscription_id != sub_id:
        raise NotFound(f"no delivery {webhook_id!r} for webhook {sub_id!r}", loc=("path", "webhook_id"))
    if not service.outbox.redeliver(webhook_id, _now(request)):
        raise Conflict(f"delivery {webhook_id!r} is {d.state}; only dead or failed ones can be redelivered")
    if service.worker is not None:
        service.worker.wake()
    return Response(status_code=202)
