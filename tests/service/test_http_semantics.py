"""HTTP as clients expect it (issue 25, smaller defects): HEAD answers as GET without a body, and
the deliveries of a webhook subscription that does not exist are a 404 naming it. A real server."""
from __future__ import annotations

import httpx
import pytest

from tests.server_process import ServerProcess

PUSH = {"records": [{"step": 0, "rank": 0, "loss": 1.0}]}


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    directory = tmp_path_factory.mktemp("semantics")
    with ServerProcess(directory / "s.db", env={"HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as client:
        assert client.post("/v1/runs/r/metrics", json=PUSH).status_code == 202
        yield client


@pytest.mark.parametrize("path", ["/healthz", "/v1/runs", "/v1/runs/r", "/v1/runs/r/metrics?format=csv", "/metrics"])
def test_head_answers_as_get_without_a_body(http, path):
    get, head = http.get(path), http.head(path)
    assert get.status_code == 200 and get.content
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


def test_head_of_an_unknown_run_is_the_get_404(http):
    assert http.get("/v1/runs/nope").status_code == http.head("/v1/runs/nope").status_code == 404


def test_deliveries_of_an_unknown_subscription_are_404_naming_it(http):
    r = http.get("/v1/webhooks/x/deliveries")
    assert r.status_code == 404, r.text
    item = r.json()["detail"][0]
    assert item["loc"] == ["path", "sub_id"] and "'x'" in item["msg"]
    # A subscription that exists, with no delivery yet, answers its (empty) list; deleted, its
    # id is unknown again (it never had a delivery to keep).
    assert http.put("/v1/webhooks/oncall", json={"url": "http://127.0.0.1:9/hook"}).status_code in (200, 201)
    r = http.get("/v1/webhooks/oncall/deliveries")
    assert r.status_code == 200 and r.json()["deliveries"] == [] and r.json()["subscription_id"] == "oncall"
    assert http.delete("/v1/webhooks/oncall").status_code == 200
    assert http.get("/v1/webhooks/oncall/deliveries").status_code == 404
