"""Webhooks cannot reach internal addresses unless opened (issue 12, finding 7), and last_error
shows the status, never the receiver's body."""
from __future__ import annotations

import json

import httpx
import pytest

from healthsvc.alerting.address_policy import AddressPolicy
from tests.server_process import ServerProcess
from tests.alerting.receiver import Receiver
from tests.harness import InProcessService


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://metadata.google.internal/computeMetadata/v1/",
    "http://127.0.0.1:9000/hook", "http://localhost/hook", "http://[::1]/hook", "http://0.0.0.0/hook",
    "http://10.1.2.3/hook", "http://192.168.0.1/hook", "http://172.16.0.1/hook", "http://100.64.0.1/hook",
    "http://[fd00:ec2::254]/", "http://[::ffff:127.0.0.1]/hook",
    # IPv6 forms of internal IPv4 addresses (issue 25): 6to4, NAT64, Teredo's client, IPv4-compatible.
    "http://[2002:a9fe:a9fe::]/", "http://[2002:7f00:1::1]/hook", "http://[64:ff9b::a9fe:a9fe]/",
    "http://[64:ff9b::10.0.0.1]/", "http://[2001:0:4136:e378:8000:63bf:5601:5601]/", "http://[::169.254.169.254]/",
])
def test_internal_addresses_are_refused_by_default(url):
    assert AddressPolicy().refusal(url) is not None


def test_ipv6_forms_of_public_ipv4_addresses_pass_and_allowed_networks_open_their_ipv6_forms():
    assert AddressPolicy().refusal("http://[2002:808:808::]/hook") is None       # 6to4 of 8.8.8.8
    assert AddressPolicy().refusal("http://[64:ff9b::8.8.8.8]/hook") is None     # NAT64 of 8.8.8.8
    why = AddressPolicy().refusal("http://[2002:a9fe:a9fe::]/")
    assert "which reaches 169.254.169.254" in why and "link-local" in why
    assert AddressPolicy.parse("127.0.0.0/8").refusal("http://[64:ff9b::127.0.0.1]/hook") is None


def test_allowed_networks_open_exactly_what_they_name():
    policy = AddressPolicy.parse("127.0.0.0/8, 10.0.0.0/8")
    assert policy.refusal("http://127.0.0.1:9000/hook") is None
    assert policy.refusal("http://10.9.9.9/hook") is None
    assert policy.refusal("http://192.168.0.1/hook") is not None
    assert policy.refusal("http://169.254.169.254/") is not None
    with pytest.raises(ValueError, match="not a CIDR"):
        AddressPolicy.parse("10.0.0.0/33")


def test_dns_is_checked_again_at_delivery():
    answers = iter([["93.184.216.34"], ["10.0.0.5"]])     # the name moved to a private address
    policy = AddressPolicy(resolve=lambda host, port: next(answers))
    assert policy.refusal("http://hooks.example.com/x") is None
    assert "private" in policy.refusal("http://hooks.example.com/x")


def test_the_service_refuses_internal_webhooks_and_hides_receiver_bodies(tmp_path):
    with ServerProcess(tmp_path / "p.db", env={"HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS": ""}) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as c:
        for url in ("http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:9/hook", "http://0.0.0.0/x"):
            resp = c.post("/v1/webhooks", json={"url": url})
            assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "url"], resp.text
            assert "refused" in resp.json()["detail"][0]["msg"]
        assert c.get("/v1/webhooks").json()["webhooks"] == []

    with Receiver(script=[("status", 400)] * 5) as rx:
        with InProcessService(tmp_path, db=tmp_path / "q.db", webhook_allowed_networks="127.0.0.0/8",
                              alert_webhooks=[{"id": "rx", "url": rx.url, "format": "json"}]) as svc:
            c = svc.http
            assert c.post("/v1/runs/r/metrics", json={"records": [{"step": 0, "rank": 0, "loss": "NaN"}]}).status_code == 202
            svc.drain()
            failed = c.get("/v1/webhooks/rx/deliveries", params={"state": "failed"}).json()
            items = failed.get("deliveries", failed) if isinstance(failed, dict) else failed
            assert items, "the 400 was not recorded"
            assert items[0]["last_error"] == "HTTP 400 Bad Request"      # not the receiver's "ok" body


def test_a_settings_webhook_to_an_internal_address_stops_the_start_loudly(tmp_path):
    env = {"HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS": "",
           "HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "meta", "url": "http://169.254.169.254/x"}])}
    srv = ServerProcess(tmp_path / "s.db", env=env)
    with pytest.raises(RuntimeError, match="169.254.169.254, a link-local address"):
        srv.start()
