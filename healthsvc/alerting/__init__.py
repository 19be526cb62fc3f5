"""Alerting: findings become alerts (labels, fingerprint, lifecycle), an Alertmanager-like policy
decides what to notify (grouping by run, waits and intervals per severity, inhibition, silences),
and a durable SQLite outbox delivers signed webhooks (Alertmanager v4, Slack, our JSON) at least
once.

Modules, one concept each::

    model         Alert, labels, fingerprint, lifecycle (fire / clear / expire / resolve)
    policy        NotifyReason, needs_update, Timing, inhibition   (pure)
    silences      Matcher, Silence (regexes compiled once), Silences: indexed matching, the cap
    subscription  Subscription: URL, body format, filters, secret, headers, bearer token
    formats       webhook bodies: alertmanager | slack | json | alertmanager_api | pagerduty
    signing       Standard Webhooks headers, sign and verify
    (healthsvc.store.outbox: the durable outbox and the alerting tables, all the SQL)
    delivery      DeliveryWorker: backoff with full jitter, Retry-After, dead letters
    manager       AlertManager: ties the above together (the notify pipeline)
    replicas      the manager with replicas: a run's alerts kept by its owner, adopted, forgotten
    admin         silences, API subscriptions, alert queries (operator CRUD; AlertManager's mixin)

Errors::

    AlertingError
    ├── NotFound
    └── ReadOnly
    signing.WebhookVerificationError   (receiver side)
"""
from healthsvc.alerting.delivery import Backoff, DeliveryWorker, parse_retry_after
from healthsvc.alerting.formats import Notification, render
from healthsvc.alerting.manager import AlertingError, AlertManager, NotFound, ReadOnly
from healthsvc.alerting.model import Alert, LifecyclePolicy, alert_labels, fingerprint
from healthsvc.store.outbox import Delivery, Outbox
from healthsvc.alerting.policy import (
    DEFAULT_TIMINGS, InhibitRule, Matcher, NotificationLogEntry, NotifyReason,
    PolicyConfig, Silence, Timing, needs_update,
)
from healthsvc.alerting.signing import WebhookVerificationError, generate_secret, sign_headers, verify
from healthsvc.alerting.subscription import Subscription

__all__ = [
    "Alert", "AlertManager", "AlertingError", "Backoff", "DEFAULT_TIMINGS",
    "Delivery", "DeliveryWorker", "InhibitRule", "LifecyclePolicy", "Matcher", "NotFound",
    "Notification", "NotificationLogEntry", "NotifyReason", "Outbox", "PolicyConfig", "ReadOnly",
    "Silence", "Subscription", "Timing", "WebhookVerificationError", "alert_labels", "fingerprint",
    "generate_secret", "needs_update", "parse_retry_after", "render", "sign_headers", "verify",
]
