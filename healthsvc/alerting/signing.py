"""Standard Webhooks signatures (https://www.standardwebhooks.com/).

Every body is sent with three headers:

- ``webhook-id``: the message id, the SAME on every retry of one delivery (receivers dedupe on it);
- ``webhook-timestamp``: unix seconds of this attempt (integer);
- ``webhook-signature``: ``v1,<base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}"))>``, where the
  key is the base64-decoded part of the secret after ``whsec_``. Several space-separated
  signatures may be present (key rotation); one valid one is enough.

Example::

    >>> secret = "whsec_" + "c2VjcmV0LWtleS1mb3ItdGVzdHM="
    >>> h = sign_headers(secret, "msg_1", 1700000000, b'{"a":1}')
    >>> verify(secret, h, b'{"a":1}', now=1700000010)
    >>> h["webhook-signature"].startswith("v1,")
    True
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Mapping

from healthsvc.store.outbox import new_webhook_id

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300


class WebhookVerificationError(Exception):
    """The headers or the signature of a webhook do not check out."""


def generate_secret(n_bytes: int = 24) -> str:
    """A fresh ``whsec_<base64>`` secret."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(n_bytes)).decode()


def generate_message_id() -> str:
    """A message id of the Standard Webhooks form (the outbox's: one id per delivery)."""
    return new_webhook_id()


def _key(secret: str) -> bytes:
    raw = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError as exc:
        raise ValueError("webhook secret must be 'whsec_' followed by base64") from exc


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def sign_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers (no signature header when ``secret`` is empty)."""
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(int(timestamp))}
    if secret:
        headers["webhook-signature"] = signature(secret, msg_id, int(timestamp), body)
    return headers


def verify(
    secret: str, headers: Mapping[str, str], body: bytes, now: float, tolerance_s: float = DEFAULT_TOLERANCE_S
) -> None:
    """Check a received webhook; raise :class:`WebhookVerificationError` when it does not verify.

    ``headers`` lookup is case-insensitive. ``now`` is the receiver's clock (unix seconds): a
    timestamp further than ``tolerance_s`` from it is rejected (replay protection).
    """
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id, ts_text, sigs = lower["webhook-id"], lower["webhook-timestamp"], lower["webhook-signature"]
    except KeyError as exc:
        raise WebhookVerificationError(f"missing header {exc.args[0]}") from None
    try:
        ts = int(ts_text)
    except ValueError:
        raise WebhookVerificationError(f"webhook-timestamp is not an integer: {ts_text!r}") from None
    if abs(now - ts) > tolerance_s:
        raise WebhookVerificationError(f"webhook-timestamp {ts} is more than {tolerance_s}s from now")
    expected = signature(secret, msg_id, ts, body).split(",", 1)[1]
    for candidate in sigs.split(" "):
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return
    raise WebhookVerificationError("no matching v1 signature")
