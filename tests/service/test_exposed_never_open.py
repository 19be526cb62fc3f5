"""A service listening beyond loopback never becomes open (issue 25, defect 3): the issue's path
was open on loopback, an admin token made, a restart on 0.0.0.0 (allowed: a token exists), the
token revoked, and then strangers read runs and made admin tokens. Real servers, one database."""
from __future__ import annotations

import httpx

from tests.server_process import ServerProcess

PUSH = {"records": [{"step": 0, "rank": 0, "loss": 1.0}]}


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _admin(c: httpx.Client, name: str, **headers: str) -> dict:
    r = c.post("/v1/tokens", json={"name": name, "scopes": ["admin"]}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def test_the_last_admin_token_of_an_exposed_service_cannot_be_revoked(tmp_path):
    db = tmp_path / "e.db"
    with ServerProcess(db, log_path=tmp_path / "loopback.log") as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        first = _admin(c, "first")
    exposed = ServerProcess(db, log_path=tmp_path / "exposed.log", extra_args=["--host", "0.0.0.0"])
    with exposed, httpx.Client(base_url=exposed.url, timeout=30) as c:
        r = c.delete(f"/v1/tokens/{first['id']}", headers=_bearer(first["token"]))
        assert r.status_code == 409, r.text
        item = r.json()["detail"][0]
        assert "last admin token" in item["msg"] and "0.0.0.0" in item["msg"]
        assert "create another admin token first" in item["hint"]
        assert c.get("/v1/runs").status_code == 401                    # still closed to strangers
        assert c.post("/v1/tokens", json={"name": "x", "scopes": ["admin"]}).status_code == 401
        # With a second admin, the first goes; then the second is the last one.
        second = _admin(c, "second", **_bearer(first["token"]))
        assert c.delete(f"/v1/tokens/{first['id']}", headers=_bearer(second["token"])).status_code == 200
        assert c.get("/v1/runs", headers=_bearer(first["token"])).status_code == 401
        assert c.delete(f"/v1/tokens/{second['id']}", headers=_bearer(second["token"])).status_code == 409
        # A read token does not count as an admin.
        reader = c.post("/v1/tokens", json={"name": "r", "scopes": ["read"]}, headers=_bearer(second["token"])).json()
        assert c.delete(f"/v1/tokens/{second['id']}", headers=_bearer(second["token"])).status_code == 409
        assert c.delete(f"/v1/tokens/{reader['id']}", headers=_bearer(second["token"])).status_code == 200
        assert c.get("/v1/runs").status_code == 401


def test_on_loopback_or_with_a_bootstrap_token_the_last_stored_admin_goes(tmp_path):
    with ServerProcess(tmp_path / "l.db") as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        tok = _admin(c, "only")
        assert c.delete(f"/v1/tokens/{tok['id']}", headers=_bearer(tok["token"])).status_code == 200
        assert c.post("/v1/runs/o/metrics", json=PUSH).status_code == 202     # open again, on loopback only
    boot = "bootstrap-secret-for-tests"
    srv = ServerProcess(tmp_path / "b.db", env={"HEALTHSVC_ADMIN_TOKEN": boot}, extra_args=["--host", "0.0.0.0"])
    with srv, httpx.Client(base_url=srv.url, timeout=30, headers=_bearer(boot)) as c:
        tok = _admin(c, "stored")
        assert c.delete(f"/v1/tokens/{tok['id']}").status_code == 200         # the bootstrap token remains
        assert httpx.get(srv.url + "/v1/runs", timeout=30).status_code == 401
