"""What a web page can make a browser send to an open service on localhost (issue 25, defect 4):
an empty form POST, and requests under a rebinding name. Real servers, real HTTP."""
from __future__ import annotations

import socket

import httpx
import pytest

from tests.server_process import ServerProcess

PUSH = {"records": [{"step": 0, "rank": 0, "loss": 1.0}]}
FORM = {"content-type": "application/x-www-form-urlencoded", "origin": "http://evil.example"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cross-site")
    with ServerProcess(directory / "c.db", log_path=directory / "c.log") as server:
        yield server


def test_an_empty_cross_site_form_post_changes_nothing(srv):
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.post("/v1/runs/victim/metrics", json=PUSH).status_code == 202
        for headers in (FORM, {"content-type": "text/plain"}, {}):     # a form, text, no type at all
            r = c.post("/v1/runs/victim/finish", headers=headers)
            assert r.status_code == 415, (headers, r.text)
            item = r.json()["detail"][0]
            assert item["loc"] == ["header", "content-type"] and "application/json" in item["msg"]
        assert c.post("/v1/silences", headers=FORM).status_code == 415
        assert c.get("/v1/runs/victim").json()["status"] != "finished"
        # What every client sends: JSON, with a body or without one.
        assert c.post("/v1/runs/victim/finish", headers={"content-type": "application/json"}).status_code == 200
        assert c.get("/v1/runs/victim").json()["status"] == "finished"


def test_a_rebinding_host_is_refused_by_default_and_the_names_of_the_listener_are_served(srv):
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.get("/v1/runs", headers={"host": "evil.example"})
        assert r.status_code == 400 and r.json()["detail"][0]["loc"] == ["header", "host"]
        assert "HEALTHSVC_ALLOWED_HOSTS" in r.json()["detail"][0]["hint"]
        assert c.post("/v1/runs/victim/finish", json={}, headers={"host": f"evil.example:{srv.port}"}).status_code == 400
        for host in (f"127.0.0.1:{srv.port}", f"localhost:{srv.port}", "localhost", "[::1]"):
            assert c.get("/v1/runs", headers={"host": host}).status_code == 200, host


def test_allowed_hosts_adds_names_and_a_star_serves_any(tmp_path):
    with ServerProcess(tmp_path / "a.db", env={"HEALTHSVC_ALLOWED_HOSTS": "healthsvc.internal"}) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.get("/v1/runs", headers={"host": "healthsvc.internal:8080"}).status_code == 200
        assert c.get("/v1/runs", headers={"host": "localhost"}).status_code == 200   # still served
        assert c.get("/v1/runs", headers={"host": "evil.example"}).status_code == 400
    with ServerProcess(tmp_path / "b.db", env={"HEALTHSVC_ALLOWED_HOSTS": "*"}) as srv:
        assert httpx.get(srv.url + "/v1/runs", headers={"host": "evil.example"}).status_code == 200


def test_on_every_address_ip_literals_and_the_machine_s_names_are_served(tmp_path):
    srv = ServerProcess(tmp_path / "w.db", extra_args=["--host", "0.0.0.0", "--insecure"])
    with srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        for host in ("10.1.2.3", f"{socket.gethostname()}:{srv.port}", "[2001:db8::1]:80"):
            assert c.get("/v1/runs", headers={"host": host}).status_code == 200, host
        assert c.get("/v1/runs", headers={"host": "evil.example"}).status_code == 400
