"""Request and response models of the alerting API (``/v1/alerts``, ``/v1/silences``, ``/v1/webhooks``).

They document the wire form in the OpenAPI schema; the handlers in :mod:`healthsvc.alerting.api`
still build plain dicts from the domain objects (``Alert.to_dict``, ``Silence.to_dict``,
``Subscription.to_dict``, ``Delivery.to_dict``) and FastAPI validates them against these models,
so every key a builder returns must be a field here (pydantic drops keys it does not know).

Times are unix seconds (floats, service clock); steps are training steps; ``score`` is unitless
in [0, 1]. Non-finite numbers travel as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``:
fields that can hold them accept those strings as they are, so validation never turns them into
floats (which would be written as ``null``, "not reported").

Example::

    >>> AlertList.model_validate({"alerts": []}).alerts
    []
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from healthsvc_detectors.registry import FINDING_KINDS
from healthsvc.store.outbox import DeliveryState
from healthsvc.alerting.policy import MatchOp, NotifyReason
from healthsvc.alerting.subscription import BodyFormat
from healthsvc.limits import PositiveSeconds, UnixSeconds

Kind = Literal[FINDING_KINDS]  # type: ignore[valid-type]
SeverityName = Literal["info", "warning", "critical"]
NonFinite = Literal["NaN", "Infinity", "-Infinity"]

_KINDS = ", ".join(FINDING_KINDS)
_REASONS = ", ".join(r.value for r in NotifyReason if r.should_notify)
_SEVERITY = "info < warning < critical"
_FORMATS = ("alertmanager = the Alertmanager v4 webhook body; slack = a Slack incoming-webhook message; "
            "json = this service's own alert objects; alertmanager_api = postable alerts for an Alertmanager "
            "(url: the Alertmanager, posted to its /api/v2/alerts, firing alerts re-sent every resend_interval_s); "
            "pagerduty = PagerDuty Events API v2, one event per alert (routing_key required) "
            "(see docs/alerting.md)")


# -- requests -----------------------------------------------------------------------------------

class Actor(BaseModel):
    by: str = Field("", max_length=200, description="Who did it (shown in notifications).")


class MatcherIn(BaseModel):
    name: str = Field(..., description="Label name: alertname, run, rank, metric or severity.")
    value: str = Field(..., description="Value to compare with; a regular expression for =~ and !~ "
                                        "(anchored: it must match the whole label value).")
    op: MatchOp = Field("=", description="= equal, != not equal, =~ regex matches, !~ regex does not match. "
                                         "A label the alert lacks compares as the empty string.")


class SilenceIn(BaseModel):
    matchers: list[MatcherIn] = Field(..., min_length=1, description="Label matchers; an alert is silenced when "
                                                                     "all of them match its labels (at least one).")
    starts_at: UnixSeconds | None = Field(None, description="Unix seconds; default now.")
    ends_at: UnixSeconds | None = Field(None, description="Unix seconds; or give duration_s.")
    duration_s: PositiveSeconds | None = Field(None, description="Length from starts_at, seconds.")
    created_by: str = Field("", description="Who created the silence (free text, for people).")
    comment: str = Field("", description="Why (free text, for people).")


class WebhookIn(BaseModel):
    url: str = Field(..., description="http(s) URL the body is POSTed to.")
    format: BodyFormat = Field("json", description="Body format: " + _FORMATS + ".")
    runs: list[str] = Field(default_factory=list, description="Only these runs (empty: all).")
    kinds: list[Kind] = Field(default_factory=list, description="Only these alert names (empty: all).")  # type: ignore[valid-type]
    min_severity: SeverityName | None = Field(
        None, description="Only alerts at least this severe (" + _SEVERITY + "). Omitted: warning for the formats "
                          "that page people (alertmanager, alertmanager_api, slack, pagerduty: info never pages), "
                          "info for json.")
    secret: str | None = Field(None, description="whsec_<base64>; omitted: one is generated and returned once;"
                                                 " empty string: bodies are sent unsigned.")
    name: str = Field("", description="Receiver name written into bodies (default: the id).")
    send_resolved: bool = Field(True, description="Also notify when alerts resolve (false: firing notifications only).")
    headers: dict[str, str] | None = Field(None, description="Extra request headers sent on every attempt (secret: "
                                                             "values are shown as ***); omitted on PUT: kept.")
    bearer_token: str | None = Field(None, max_length=4096, description="Sent as Authorization: Bearer <token> on "
                                                                       "every attempt (secret); omitted on PUT: kept.")
    pass_through: bool = Field(False, description="Send every new firing and resolved alert at once, with no "
                                                  "grouping, inhibition or silences here (the receiver does them).")
    resend_interval_s: float = Field(60.0, ge=1, le=3600, description="alertmanager_api: re-send firing alerts this "
                                                                      "often, seconds (endsAt is 4 intervals ahead). "
                                                                      "Every format: a resolution is sent within this "
                                                                      "long, not after the group interval.")
    routing_key: str | None = Field(None, max_length=256, description="pagerduty: the integration (routing) key of "
                                                                     "the PagerDuty service (secret); omitted on PUT: kept.")


class WebhookCreate(WebhookIn):
    id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$", description="Default: generated.")


# -- alerts -------------------------------------------------------------------------------------

class Alert(BaseModel):
    """An alert: one (alertname, run, rank, metric) label set, with its lifecycle."""

    fingerprint: str = Field(..., description="Identity of the alert: 16 hex digits of SHA-256 over its sorted "
                                              "identity labels (alertname, run, rank, metric).")
    status: Literal["firing", "resolved"] = Field(..., description="firing until ends_at is set, then resolved.")
    labels: dict[str, str] = Field(..., description="Routing labels, as receivers see them: alertname (the finding "
                                                    "kind), run, rank (the blamed rank, or \"*\" when run-wide or "
                                                    "several ranks are blamed), metric (absent when the finding "
                                                    "names none) and severity.")
    annotations: dict[str, str] = Field(..., description="Human part, all strings as in Alertmanager: summary, "
                                                         "first_step, last_step, score, and when known onset_step, "
                                                         "ranks (compacted ranges, e.g. \"0-511\"), rank_count, hosts "
                                                         "(first 16), rollback_target, acknowledged_by, resolved_by, "
                                                         "description (what happened and what the alert name "
                                                         "means), run_url (the run's dashboard page) and "
                                                         "runbook_url (the kind's section of the runbook).")
    kind: str = Field(..., description="Alert name = finding kind: " + _KINDS + " (GET /v1/kinds lists what each means).")
    run: str = Field(..., description="Run id.")
    severity: SeverityName = Field(..., description="Highest severity of the findings folded into the alert ("
                                                    + _SEVERITY + "); not part of the identity.")
    ranks: list[int] = Field(..., description="Ranks blamed by the findings folded into the alert (union, "
                                              "ascending); empty when run-wide.")
    hosts: list[str] = Field(..., description="Hosts of the blamed ranks that are known, each once, in "
                                              "the order the findings blamed them (at most 256).")
    first_step: int = Field(..., description="Earliest step of a firing finding folded into the alert (training step).")
    last_step: int = Field(..., description="Latest step of a firing finding folded into the alert (training step).")
    onset_step: int | None = Field(..., description="Step where the detector places the start of the problem "
                                                    "(earlier than first_step for slow ones), or null.")
    score: float | NonFinite = Field(..., description="Highest finding score, unitless in [0, 1] (0 = barely past "
                                                      "the threshold, 1 = as bad as the detector can say).")
    latched: bool = Field(..., description="Latched kinds (resolves: latched in GET /v1/kinds: non_finite, rank_outlier, divergence, the exact checks) stay firing "
                                           "until resolved by hand or by a rollback.")
    starts_at: float = Field(..., description="When the alert opened (or re-opened), unix seconds.")
    ends_at: float | None = Field(..., description="When it resolved, unix seconds; null while firing.")
    last_seen_at: float = Field(..., description="Latest firing finding folded into it, unix seconds.")
    cleared_at: float | None = Field(..., description="When a resolved finding said its condition cleared, unix "
                                                      "seconds: a non-latched alert resolves then; a latched one "
                                                      "stays firing. Null while the condition holds.")
    resolved_by: str | None = Field(
        ..., description="Who resolved it: condition (a resolved finding, or no finding for "
                         "alert_resolve_timeout_s), rollback, or the by of POST .../resolve (\"hand\" when it "
                         "named nobody); null while firing.")
    acknowledged_at: float | None = Field(..., description="When someone acknowledged it, unix seconds; null if "
                                                           "nobody did.")
    acknowledged_by: str | None = Field(..., description="Who acknowledged it; null if nobody did.")
    rollback_target: dict[str, Any] | None = Field(
        ..., description="For latched alerts: the checkpoint to resume from when the alert opened ({id, step, "
                         "uri}, as in GET /v1/runs/{run_id}/rollback), or null.")
    evidence: dict[str, Any] = Field(..., description="The numbers behind the decision, from the finding that "
                                                      "opened the alert (free-form, detector-specific).")


class AlertView(Alert):
    """An alert as listed, with whether its notifications are muted."""

    silenced_by: list[str] = Field(..., description="Ids of the active silences matching the alert (its "
                                                    "notifications are muted); empty when none.")
    inhibited: bool = Field(..., description="True when a firing alert of the same run explains it and mutes "
                                             "its notifications (non_finite mutes loss_spike, grad_spike, "
                                             "divergence; stall mutes hang, straggler).")


class AlertList(BaseModel):
    alerts: list[AlertView] = Field(..., description="Matching alerts, newest first (by starts_at).")


# -- silences -----------------------------------------------------------------------------------

class SilenceMatcher(MatcherIn):
    """A label matcher of a silence, as stored."""


class Silence(BaseModel):
    id: str = Field(..., description="Silence id (sil_<hex>); DELETE /v1/silences/{id} expires it.")
    matchers: list[SilenceMatcher] = Field(..., description="Label matchers; all must match an alert's labels.")
    starts_at: float = Field(..., description="Start, unix seconds.")
    ends_at: float = Field(..., description="End, unix seconds (DELETE sets it to the time of the request).")
    created_by: str = Field(..., description="Who created it.")
    comment: str = Field(..., description="Why.")
    state: Literal["active", "pending", "expired"] = Field(
        ..., description="At the time of the answer: pending (before starts_at), active, or expired (from ends_at).")


class SilenceList(BaseModel):
    silences: list[Silence] = Field(..., description="Every silence (active, pending and expired).")


# -- webhooks -----------------------------------------------------------------------------------

class DeliveryCounts(BaseModel):
    """Deliveries per state, every state present (0 when none)."""

    pending: int = Field(..., description="Queued or waiting for a retry, count.")
    delivered: int = Field(..., description="Answered 2xx, count.")
    failed: int = Field(..., description="Refused with a non-retryable answer (4xx but 429, 3xx), count.")
    dead: int = Field(..., description="Still failing HEALTHSVC_ALERT_DEAD_AFTER_S after queueing (the dead "
                                       "letters), count.")
    cancelled: int = Field(..., description="Pending when their subscription was deleted, count.")


class Webhook(BaseModel):
    """A webhook subscription with its delivery counts."""

    id: str = Field(..., description="Subscription id.")
    url: str = Field(..., description="http(s) URL bodies are POSTed to.")
    format: BodyFormat = Field(..., description="Body format: " + _FORMATS + ".")
    runs: list[str] = Field(..., description="Only these runs (empty: all).")
    kinds: list[Kind] = Field(..., description="Only these alert names (empty: all).")  # type: ignore[valid-type]
    min_severity: SeverityName = Field(..., description="Only alerts at least this severe (" + _SEVERITY + ").")
    secret: str = Field(..., description="\"whsec_***\" (set, hidden), \"\" (bodies sent unsigned), or the full "
                                         "whsec_<base64> secret once, in the answer that generated it.")
    name: str = Field(..., description="Receiver name written into bodies (empty: the id is used).")
    source: Literal["settings", "api"] = Field(..., description="Where it comes from: settings "
                                                                "(HEALTHSVC_ALERT_WEBHOOKS, read-only here) or api.")
    send_resolved: bool = Field(..., description="Whether resolutions are notified too.")
    headers: dict[str, str] = Field(..., description="Extra request headers, values hidden as ***.")
    bearer_token: str = Field(..., description="\"***\" when set (hidden), else \"\".")
    pass_through: bool = Field(..., description="No grouping, inhibition or silences here.")
    resend_interval_s: float = Field(..., description="alertmanager_api: firing alerts are re-sent this often, seconds.")
    routing_key: str = Field(..., description="pagerduty: \"***\" when set (hidden), else \"\".")
    deliveries: DeliveryCounts = Field(..., description="Deliveries of this subscription per state, counts.")


class WebhookList(BaseModel):
    webhooks: list[Webhook] = Field(..., description="Every subscription, settings ones first.")


class WebhookDeleted(BaseModel):
    cancelled: int = Field(..., description="Pending deliveries cancelled with the subscription, count.")


class Delivery(BaseModel):
    """One delivery of one notification to one subscription (no body, no secret)."""

    webhook_id: str = Field(..., description="The webhook-id header value (msg_<hex>), the same on every attempt: "
                                             "receivers dedupe on it.")
    subscription_id: str = Field(..., description="Subscription it is for.")
    group_key: str = Field(..., description="Alert group notified, Alertmanager-shaped: {}:{run=\"<run>\"}.")
    reason: str = Field(..., description="Why it was sent: " + _REASONS + ".")
    state: DeliveryState = Field(..., description="pending -> delivered | failed | dead; cancelled when its "
                                                  "subscription was deleted.")
    created_at: float = Field(..., description="When it was queued (or queued again by redeliver), unix seconds.")
    next_attempt_at: float = Field(..., description="When the next attempt is due (if pending), unix seconds.")
    attempts: int = Field(..., description="Attempts made so far, count.")
    last_attempt_at: float | None = Field(..., description="Latest attempt, unix seconds; null before the first.")
    last_status: int | None = Field(..., description="HTTP status of the latest answer; null when there was none "
                                                     "(no attempt yet, connection error, timeout).")
    last_error: str | None = Field(..., description="Error of the latest failed attempt, or null.")
    delivered_at: float | None = Field(..., description="When a 2xx answer arrived, unix seconds; null until then.")


class DeliveryList(BaseModel):
    subscription_id: str = Field(..., description="The subscription asked about.")
    counts: DeliveryCounts = Field(..., description="All its deliveries per state, counts (not limited by "
                                                    "state or limit).")
    deliveries: list[Delivery] = Field(..., description="Recent deliveries, newest first, filtered by state, "
                                                        "at most limit.")
