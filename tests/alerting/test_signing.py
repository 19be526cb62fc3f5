"""Standard Webhooks signatures: the published test vector, round trips, and rejections."""
from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from healthsvc.alerting.signing import (
    WebhookVerificationError, generate_secret, sign_headers, signature, verify,
)

# The example of the Standard Webhooks specification / reference libraries.
VECTOR = dict(secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", msg_id="msg_p5jXN8AQM9LWM0D4loKWxJek",
              timestamp=1614265330, body=b'{"test": 2432232314}',
              signature="v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")


def test_published_vector():
    v = VECTOR
    assert signature(v["secret"], v["msg_id"], v["timestamp"], v["body"]) == v["signature"]


def test_signature_is_hmac_sha256_of_id_timestamp_body_with_the_decoded_key():
    secret = generate_secret()
    key = base64.b64decode(secret.removeprefix("whsec_"))
    body = b'{"alerts":[]}'
    h = sign_headers(secret, "msg_x", 1700000000, body)
    expected = base64.b64encode(hmac.new(key, b"msg_x.1700000000." + body, hashlib.sha256).digest()).decode()
    assert h == {"webhook-id": "msg_x", "webhook-timestamp": "1700000000", "webhook-signature": "v1," + expected}


def test_verify_accepts_good_and_rotated_signatures_case_insensitively():
    secret, other = generate_secret(), generate_secret()
    body = b"{}"
    h = sign_headers(secret, "msg_1", 1000, body)
    verify(secret, {k.upper(): v for k, v in h.items()}, body, now=1000.0)
    rotated = {**h, "webhook-signature": signature(other, "msg_1", 1000, body) + " " + h["webhook-signature"]}
    verify(secret, rotated, body, now=1000.0)


@pytest.mark.parametrize("mutate,message", [
    (lambda h, b: (h, b + b" "), "no matching"),
    (lambda h, b: ({**h, "webhook-id": "msg_2"}, b), "no matching"),
    (lambda h, b: ({**h, "webhook-timestamp": "1001"}, b), "no matching"),
    (lambda h, b: ({**h, "webhook-timestamp": "0"}, b), "more than"),
    (lambda h, b: ({k: v for k, v in h.items() if k != "webhook-signature"}, b), "missing header"),
    (lambda h, b: ({**h, "webhook-signature": "v2," + h["webhook-signature"][3:]}, b), "no matching"),
])
def test_verify_rejects(mutate, message):
    secret = generate_secret()
    body = b'{"a":1}'
    h, b = mutate(sign_headers(secret, "msg_1", 1000, body), body)
    with pytest.raises(WebhookVerificationError, match=message):
        verify(secret, h, b, now=1000.0)


def test_wrong_secret_does_not_verify():
    body = b"{}"
    h = sign_headers(generate_secret(), "msg_1", 1000, body)
    with pytest.raises(WebhookVerificationError):
        verify(generate_secret(), h, body, now=1000.0)


def test_unsigned_when_no_secret():
    assert "webhook-signature" not in sign_headers("", "msg_1", 1000, b"{}")
