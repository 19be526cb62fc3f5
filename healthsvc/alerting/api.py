"""HTTP API of alerting: ``/v1/alerts``, ``/v1/silences``, ``/v1/webhooks``.

Handlers are sync (FastAPI runs them in its threadpool) because the manager's writes wait for the
store's group commit. Each handler is a few lines over :class:`~healthsvc.alerting.AlertManager`.
Handlers return the domain objects' dicts; ``response_model`` (models in
:mod:`healthsvc.alerting.schemas`) documents every field in the OpenAPI schema.
"""
from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response

from healthsvc.alerting import manager as mgr
from healthsvc.alerting import schemas as out
from healthsvc.alerting.manager import AlertManager
from healthsvc.alerting.model import SERVICE_RESOLVERS
from healthsvc.alerting.policy import Matcher
from healthsvc.alerting.schemas import (
    Actor, DeliveryState, Kind, SeverityName, SilenceIn, WebhookCreate, WebhookIn,
)
from healthsvc.alerting.signing import generate_secret
from healthsvc.alerting.subscription import Subscription
from healthsvc.errors import Conflict, InvalidInput, NotFound
from healthsvc.schemas import ErrorBody

router = APIRouter(prefix="/v1", tags=["alerting"])

Fingerprint = Annotated[str, Path(description="The alert's fingerprint: 16 hex digits, as in GET /v1/alerts.")]
SilenceId = Annotated[str, Path(description="The silence's id (sil_<hex>), as returned when it was created.")]
SubscriptionId = Annotated[str, Path(description="The webhook subscription's id.")]
WebhookId = Annotated[str, Path(description="The delivery's webhook-id (msg_<hex>), as sent in the webhook-id "
                                            "header and listed by GET .../deliveries.")]


def _errors(why_by_status: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of error answers: ``{404: "why"}`` -> the error body, described."""
    return {code: {"model": ErrorBody, "description": why} for code, why in why_by_status.items()}


_NOT_STARTED = "Alerting is not started yet: retry once /readyz answers 200."


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

def _alert_view(m: AlertManager, alerts: list, now: float, external_url: str) -> list[dict[str, Any]]:
    muting = m.muting(alerts, now)
    return [{**a.to_dict(external_url, m.runbook_url), **muting[a.fingerprint]} for a in alerts]


@router.get("/alerts", summary="Alerts, newest first", response_model=out.AlertList,
            response_description="Matching alerts, each with whether its notifications are muted.",
            responses=_errors({409: _NOT_STARTED}))
def list_alerts(
    request: Request,
    run: Annotated[str | None, Query(description="Only this run.")] = None,
    kind: Annotated[Kind | None, Query(description="Only this alert name (finding kind).")] = None,
    status: Annotated[Literal["firing", "resolved"] | None,
                      Query(description="Only firing or only resolved alerts (default: both).")] = None,
    min_severity: Annotated[SeverityName | None,
                            Query(description="Only alerts at least this severe (info < warning < critical).")] = None,
    acknowledged: Annotated[bool | None, Query(description="true: only acknowledged alerts; false: only "
                                                           "unacknowledged ones (default: both).")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="At most this many alerts (the newest), count.")] = 500,
) -> dict[str, Any]:
    m = _manager(request)
    alerts = m.alerts(run=run, kind=kind, status=status, min_severity=min_severity, acknowledged=acknowledged)[:limit]
    return {"alerts": _alert_view(m, alerts, _now(request), m.external_url)}


@router.get("/alerts/{fingerprint}", summary="One alert", response_model=out.AlertView,
            response_description="The alert, with whether its notifications are muted.",
            responses=_errors({404: "No alert with this fingerprint.", 409: _NOT_STARTED}))
def get_alert(fingerprint: Fingerprint, request: Request) -> dict[str, Any]:
    m = _manager(request)
    try:
        a = m.alert(fingerprint)
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "fingerprint")) from None
    return _alert_view(m, [a], _now(request), m.external_url)[0]


@router.post("/alerts/{fingerprint}/acknowledge", summary="Someone is on it: stops repeat notifications",
             response_model=out.Alert, response_description="The alert, acknowledged.",
             responses=_errors({404: "No alert with this fingerprint.", 409: _NOT_STARTED}))
def acknowledge_alert(fingerprint: Fingerprint, body: Actor, request: Request) -> dict[str, Any]:
    m = _manager(request)
    try:
        a = m.acknowledge(fingerprint, body.by, _now(request))
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "fingerprint")) from None
    return a.to_dict(m.external_url, m.runbook_url)


@router.post("/alerts/{fingerprint}/resolve", summary="Resolve by hand (latched alerts too)",
             response_model=out.Alert, response_description="The alert, resolved (unchanged if it already was).",
             responses=_errors({404: "No alert with this fingerprint.", 409: _NOT_STARTED,
                                422: "by names the service itself (condition, rollback)."}))
def resolve_alert(fingerprint: Fingerprint, body: Actor, request: Request) -> dict[str, Any]:
    if body.by in SERVICE_RESOLVERS:   # resolved_by would read as the service's own resolution
        raise InvalidInput(f"{body.by!r} is what the service records when it resolves an alert itself",
                           loc=("body", "by"), hint="give your name (or nothing: resolved_by is then \"hand\")")
    m = _manager(request)
    try:
        a = m.resolve(fingerprint, body.by, _now(request))
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "fingerprint")) from None
    return a.to_dict(m.external_url, m.runbook_url)


# -- silences -----------------------------------------------------------------------------------

@router.get("/silences", summary="Silences (active, pending and expired)", response_model=out.SilenceList,
            response_description="Every silence, with its state now.", responses=_errors({409: _NOT_STARTED}))
def list_silences(request: Request) -> dict[str, Any]:
    now = _now(request)
    return {"silences": [s.to_dict(now) for s in _manager(request).silences()]}


@router.post("/silences", status_code=201, summary="Mute notifications of matching alerts until an expiry",
             response_model=out.Silence, response_description="The silence created.",
             responses=_errors({409: _NOT_STARTED}))
def create_silence(body: SilenceIn, request: Request) -> dict[str, Any]:
    now = _now(request)
    starts = body.starts_at if body.starts_at is not None else now
    if (body.ends_at is None) == (body.duration_s is None):
        raise InvalidInput("give exactly one of ends_at or duration_s", loc=("body",))
    if body.ends_at is not None:
        ends = body.ends_at
    else:
        assert body.duration_s is not None   # exactly one of the two (checked above)
        ends = starts + float(body.duration_s)
    try:
        s = _manager(request).add_silence([Matcher(m.name, m.value, m.op) for m in body.matchers], starts, ends,
                                          now, body.created_by, body.comment)
    except Exception as exc:  # ValueError from matcher/silence validation, re.error for bad regexes
        raise InvalidInput(str(exc), loc=("body",)) from None
    return s.to_dict(now)


@router.delete("/silences/{silence_id}", summary="Expire a silence now", response_model=out.Silence,
               response_description="The silence, expired (kept and listed).",
               responses=_errors({404: "No silence with this id.", 409: _NOT_STARTED}))
def expire_silence(silence_id: SilenceId, request: Request) -> dict[str, Any]:
    now = _now(request)
    try:
        return _manager(request).expire_silence(silence_id, now).to_dict(now)
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "silence_id")) from None


# -- webhooks -----------------------------------------------------------------------------------

def _subscription_view(request: Request, s: Subscription, reveal: bool = False) -> dict[str, Any]:
    return {**s.to_dict(reveal_secret=reveal), "deliveries": _service(request).outbox.state_counts(s.id)}


def _put(request: Request, sub_id: str, body: WebhookIn, existing: Subscription | None) -> dict[str, Any]:
    secret = body.secret
    generated = secret is None and existing is None
    if secret is None:
        secret = existing.secret if existing is not None else generate_secret()
    def kept(given, field: str, empty):  # secrets: omitted on PUT keeps the stored value
        return given if given is not None else (getattr(existing, field) if existing is not None else empty)
    headers = tuple(body.headers.items()) if body.headers is not None else kept(None, "headers", ())
    refused = _service(request).address_policy.refusal(body.url)
    if refused:
        raise InvalidInput(refused, loc=("body", "url"),
                           hint="an operator can open a network with HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS")
    try:
        sub = Subscription(id=sub_id, url=body.url, format=body.format, runs=tuple(body.runs),
                           kinds=tuple(body.kinds), min_severity=body.min_severity or "", secret=secret,
                           name=body.name, send_resolved=body.send_resolved, headers=headers,
                           bearer_token=kept(body.bearer_token, "bearer_token", ""),
                           pass_through=body.pass_through, resend_interval_s=body.resend_interval_s,
                           routing_key=kept(body.routing_key, "routing_key", ""))
        sub = _manager(request).put_subscription(sub, _now(request))
    except (ValueError, mgr.AlertingError) as exc:
        raise _domain(exc, ("body",)) from None
    return _subscription_view(request, sub, reveal=generated)


@router.get("/webhooks", summary="Webhook subscriptions (settings and API), with delivery counts",
            response_model=out.WebhookList, response_description="Every subscription (secrets hidden).",
            responses=_errors({409: _NOT_STARTED}))
def list_webhooks(request: Request) -> dict[str, Any]:
    return {"webhooks": [_subscription_view(request, s) for s in _manager(request).subscriptions()]}


@router.post("/webhooks", status_code=201, summary="Add a webhook subscription (a generated secret is shown once)",
             response_model=out.Webhook,
             response_description="The subscription; its secret in full when it was generated by this request.",
             responses=_errors({409: "A subscription with this id exists (PUT replaces it), or alerting is not "
                                     "started yet.",
                                422: "A field is wrong (e.g. a url that is not http(s), a secret not whsec_...)."}))
def create_webhook(body: WebhookCreate, request: Request) -> dict[str, Any]:
    sub_id = body.id or "wh_" + secrets.token_hex(6)
    m = _manager(request)
    if any(s.id == sub_id for s in m.subscriptions()):
        raise Conflict(f"webhook {sub_id!r} exists", loc=("body", "id"), hint=f"PUT /v1/webhooks/{sub_id} replaces it")
    return _put(request, sub_id, body, None)


@router.get("/webhooks/{sub_id}", summary="One subscription with its delivery counts", response_model=out.Webhook,
            response_description="The subscription (secret hidden).",
            responses=_errors({404: "No subscription with this id.", 409: _NOT_STARTED}))
def get_webhook(sub_id: SubscriptionId, request: Request) -> dict[str, Any]:
    try:
        return _subscription_view(request, _manager(request).subscription(sub_id))
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "sub_id")) from None


@router.put("/webhooks/{sub_id}", summary="Create or replace a subscription (secret kept when omitted)",
            response_model=out.Webhook,
            response_description="The subscription; its secret in full when it was generated by this request.",
            responses=_errors({409: "The subscription comes from settings (read-only here), or alerting is not "
                                    "started yet.",
                               422: "A field is wrong (e.g. a url that is not http(s), a secret not whsec_...)."}))
def put_webhook(sub_id: SubscriptionId, body: WebhookIn, request: Request) -> dict[str, Any]:
    try:
        existing = _manager(request).subscription(sub_id)
    except mgr.NotFound:
        existing = None
    return _put(request, sub_id, body, existing)


@router.delete("/webhooks/{sub_id}", summary="Delete a subscription; its pending deliveries are cancelled",
               response_model=out.WebhookDeleted, response_description="How many pending deliveries were cancelled.",
               responses=_errors({404: "No subscription with this id.",
                                  409: "The subscription comes from settings (remove it there), or alerting is not "
                                       "started yet."}))
def delete_webhook(sub_id: SubscriptionId, request: Request) -> dict[str, Any]:
    try:
        return {"cancelled": _manager(request).delete_subscription(sub_id, _now(request))}
    except mgr.AlertingError as exc:
        raise _domain(exc, ("path", "sub_id")) from None


@router.get("/webhooks/{sub_id}/deliveries", summary="Delivery status: counts and recent deliveries",
            response_model=out.DeliveryList,
            response_description="Counts per state and the newest deliveries (a deleted subscription's too).",
            responses=_errors({404: "No subscription with this id, and none ever had a delivery.",
                               409: _NOT_STARTED}))
def list_deliveries(
    sub_id: SubscriptionId, request: Request,
    state: Annotated[DeliveryState | None, Query(description="Only this state; dead = the dead letters.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000,
                                description="At most this many deliveries (the newest), count.")] = 100,
) -> dict[str, Any]:
    outbox = _service(request).outbox
    counts = outbox.state_counts(sub_id)
    # A deleted subscription keeps its delivery history (the cancelled ones say what it missed);
    # an id that never had a subscription is a typo, and an empty answer would hide it.
    if not any(counts.values()) and not any(s.id == sub_id for s in _manager(request).subscriptions()):
        raise NotFound(f"no webhook subscription {sub_id!r}", loc=("path", "sub_id"),
                       hint="GET /v1/webhooks lists the subscriptions")
    return {"subscription_id": sub_id, "counts": counts,
            "deliveries": [d.to_dict() for d in outbox.deliveries(sub_id, state, limit)]}


@router.post("/webhooks/{sub_id}/deliveries/{webhook_id}/redeliver", summary="Queue a dead or failed delivery again",
             status_code=202, response_class=Response,
             responses={202: {"description": "Queued again, with the same webhook-id and a fresh max age; no body."},
                        **_errors({404: "No such delivery for this subscription.",
                                   409: "The delivery is not dead or failed (pending, delivered or cancelled)."})})
def redeliver(sub_id: SubscriptionId, webhook_id: WebhookId, request: Request) -> Response:
    service = _service(request)
    d = service.outbox.get(webhook_id)
    if d is None or d.subscription_id != sub_id:
        raise NotFound(f"no delivery {webhook_id!r} for webhook {sub_id!r}", loc=("path", "webhook_id"))
    if not service.outbox.redeliver(webhook_id, _now(request)):
        raise Conflict(f"delivery {webhook_id!r} is {d.state}; only dead or failed ones can be redelivered")
    if service.worker is not None:
        service.worker.wake()
    return Response(status_code=202)
