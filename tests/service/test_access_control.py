"""Access control (issue 12, finding 6): tokens, scopes, the fast path, the open default, the
audit log, Content-Type and Host checks. Real servers, real HTTP, the real trainer client."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from healthsvc.store.open import open_store
from tests.pg import database_for

pytestmark = pytest.mark.both_stores

from tests.barriers import answers_ok, wait_until
from tests.server_process import ServerProcess, free_port

ADMIN = "bootstrap-secret-for-tests"
PUSH = {"records": [{"step": 0, "rank": 0, "loss": 1.0}]}


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory, db_kind):
    directory = tmp_path_factory.mktemp("auth")
    with database_for(db_kind, directory) as db, \
            ServerProcess(db, env={"HEALTHSVC_ADMIN_TOKEN": ADMIN}, log_path=directory / "a.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def tokens(secured):
    """An ingest token limited to runs 'team-a-*', a read token, an admin token."""
    out = {}
    with httpx.Client(base_url=secured.url, timeout=30, headers=_bearer(ADMIN)) as c:
        for name, scopes, prefix in (("trainer", ["ingest"], "team-a-"), ("analyst", ["read"], None),
                                     ("oncall", ["admin"], None)):
            r = c.post("/v1/tokens", json={"name": name, "scopes": scopes, "run_prefix": prefix})
            assert r.status_code == 201, r.text
            out[name] = r.json()["token"]
    return out


@pytest.mark.parametrize("fast_path", [True])
def test_no_token_is_401_and_a_wrong_scope_is_403_naming_the_scope(secured, tokens, fast_path):
    with httpx.Client(base_url=secured.url, timeout=30) as c:
        r = c.post("/v1/runs/team-a-1/metrics", json=PUSH)        # the ingest fast path
        assert r.status_code == 401 and "'ingest'" in r.json()["detail"][0]["msg"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert c.post("/v1/runs/team-a-1/metrics", json=PUSH, headers=_bearer("hs_wrong")).status_code == 401
        r = c.post("/v1/runs/team-a-1/metrics", json=PUSH, headers=_bearer(tokens["analyst"]))
        assert r.status_code == 403 and "'ingest'" in r.json()["detail"][0]["msg"]
        assert c.post("/v1/runs/team-a-1/metrics", json=PUSH, headers=_bearer(tokens["trainer"])).status_code == 202
        r = c.post("/v1/runs/team-b-1/metrics", json=PUSH, headers=_bearer(tokens["trainer"]))
        assert r.status_code == 403 and "team-a-" in r.json()["detail"][0]["msg"]
        assert c.get("/v1/runs/team-a-1", headers=_bearer(tokens["trainer"])).status_code == 403
        assert c.get("/v1/runs/team-a-1", headers=_bearer(tokens["analyst"])).status_code == 200
        assert c.get("/v1/runs").status_code == 401
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200
        # Admin actions need admin: a silence for a year, a config change, a webhook.
        for method, path, body in (("POST", "/v1/silences", {"matchers": [{"name": "run", "value": "x"}],
                                                             "duration_s": 3e7}),
                                   ("PUT", "/v1/runs/team-a-1", {"world_size": 4}),
                                   ("POST", "/v1/webhooks", {"url": "http://127.0.0.1:9/x"}),
                                   ("POST", "/v1/runs/team-a-1/finish", {}),
                                   ("GET", "/v1/tokens", None)):
            needed = "ingest" if path.endswith("/finish") else "admin"
            r = c.request(method, path, json=body, headers=_bearer(tokens["analyst"]))
            assert r.status_code == 403 and f"'{needed}'" in r.json()["detail"][0]["msg"], (path, r.text)
        r = c.put("/v1/runs/team-a-1", json={"world_size": 4}, headers=_bearer(tokens["oncall"]))
        assert r.status_code == 200


def test_tokens_are_listed_without_secrets_stored_hashed_and_revocable(secured, tokens):
    with httpx.Client(base_url=secured.url, timeout=30, headers=_bearer(tokens["oncall"])) as c:
        listed = c.get("/v1/tokens").json()
        assert {t["name"] for t in listed} >= {"trainer", "analyst", "oncall"}
        assert all("token" not in t for t in listed)
        store = open_store(secured.db_path)   # a second reader of the server's database
        store.open()
        try:
            stored = [t.hash for t in store.tokens.live()]
        finally:
            store.close()
        assert tokens["trainer"] not in stored and len(stored[0]) == 64
        r = c.post("/v1/tokens", json={"name": "tmp", "scopes": ["read"]})
        tmp_id, tmp_secret = r.json()["id"], r.json()["token"]
        assert c.get("/v1/runs", headers=_bearer(tmp_secret)).status_code == 200
        assert c.delete(f"/v1/tokens/{tmp_id}").status_code == 200
        assert c.get("/v1/runs", headers=_bearer(tmp_secret)).status_code == 401
        # Who did what, when: the admin actions of this module, newest first.
        audit = c.get("/v1/audit").json()
        assert audit[0]["method"] == "DELETE" and audit[0]["path"] == f"/v1/tokens/{tmp_id}"
        assert audit[0]["actor"].startswith("oncall") and audit[0]["status"] == 200 and audit[0]["at"] > 0
        assert any(e["path"] == "/v1/tokens" and e["actor"].startswith("HEALTHSVC_ADMIN_TOKEN") for e in audit)
        assert c.get("/v1/audit", headers=_bearer(tokens["analyst"])).status_code == 403


def test_the_trainer_client_and_the_cli_send_healthsvc_token(secured, tokens, tmp_path):
    script = (
        "import healthsvc_client as health, time\n"
        f"health.init({secured.url!r}, run_id='team-a-client', rank=0, world_size=1)\n"
        "for step in range(3): health.log(loss=1.0, step=step)\n"
        "health.finish()\n")
    env = {**os.environ, "HEALTHSVC_TOKEN": tokens["trainer"]}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    with httpx.Client(base_url=secured.url, timeout=30, headers=_bearer(tokens["analyst"])) as c:
        run = c.get("/v1/runs/team-a-client").json()
        assert run["last_step"] == 2 and run["status"] == "finished"
    out = subprocess.run([sys.executable, "-m", "healthsvc", "rollback", "team-a-client", "--url", secured.url],
                         env={**os.environ, "HEALTHSVC_TOKEN": tokens["analyst"]}, capture_output=True, text=True,
                         timeout=60)
    # The run has no checkpoint: the answer is "none" (exit status 3), but it is an answer, not
    # a refusal (the token was accepted).
    assert out.returncode == 3 and out.stdout.splitlines()[0] == "none", (out.stdout, out.stderr)
    denied = subprocess.run([sys.executable, "-m", "healthsvc", "rollback", "team-a-client", "--url", secured.url],
                            env={k: v for k, v in os.environ.items() if k != "HEALTHSVC_TOKEN"},
                            capture_output=True, text=True, timeout=60)
    assert denied.returncode != 0 and "401" in denied.stdout + denied.stderr


def test_bodies_must_be_json_and_hosts_can_be_limited(tmp_path):
    env = {"HEALTHSVC_ALLOWED_HOSTS": "127.0.0.1,localhost"}
    with ServerProcess(tmp_path / "h.db", env=env) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/v1/runs/x/metrics", content=b'{"records": []}', headers={"content-type": "text/plain"})
        assert r.status_code == 415 and r.json()["detail"][0]["loc"] == ["header", "content-type"]
        r = c.post("/v1/silences", content=b"matchers=x", headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415
        assert c.post("/v1/runs/x/metrics", json=PUSH).status_code == 202
        r = c.get("/v1/runs", headers={"host": "evil.example"})
        assert r.status_code == 400 and r.json()["detail"][0]["loc"] == ["header", "host"]
        assert c.get("/v1/runs", headers={"host": f"localhost:{srv.port}"}).status_code == 200


def test_open_by_default_on_loopback_loudly_and_refused_elsewhere(tmp_path):
    with ServerProcess(tmp_path / "o.db") as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.post("/v1/runs/o/metrics", json=PUSH).status_code == 202    # as today, no token
        log = open(srv.log_path).read()
        assert "healthsvc is OPEN" in log
        # The first token must be an admin (it switches access control on).
        assert c.post("/v1/tokens", json={"name": "t", "scopes": ["ingest"]}).status_code == 422
        first = c.post("/v1/tokens", json={"name": "first", "scopes": ["admin"]})
        assert first.status_code == 201
        assert c.post("/v1/runs/o/metrics", json=PUSH).status_code == 401    # now it is on, at once
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "healthsvc", "serve", "--db", str(tmp_path / "n.db"),
                           "--host", "0.0.0.0", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "refusing to listen on 0.0.0.0" in proc.stderr
    insecure = subprocess.Popen([sys.executable, "-m", "healthsvc", "serve", "--db", str(tmp_path / "n.db"),
                                 "--host", "0.0.0.0", "--port", str(port), "--insecure"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: answers_ok(f"http://127.0.0.1:{port}/readyz"), timeout_s=30,
                   what="--insecure to start")
    finally:
        insecure.terminate()
        insecure.wait(15)


def test_the_readme_security_snippet_creates_a_token(tmp_path):
    """The README's token commands, run as written (the address points at a test server)."""
    import json
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"## Security.*?```bash\n(.*?)```", readme, re.S).group(1)
    export, serve, curl = block.split("\n", 2)
    assert export.startswith("export HEALTHSVC_ADMIN_TOKEN=") and serve.startswith("./dev serve")
    admin = subprocess.run(["bash", "-c", export + "; echo $HEALTHSVC_ADMIN_TOKEN"], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert len(admin) >= 40
    with ServerProcess(tmp_path / "r.db", env={"HEALTHSVC_ADMIN_TOKEN": admin}) as srv:
        command = curl.split("#")[0].replace("http://127.0.0.1:8080", srv.url)
        out = subprocess.run(["bash", "-c", command], env={**os.environ, "HEALTHSVC_ADMIN_TOKEN": admin},
                             capture_output=True, text=True, timeout=60, check=True)
        created = json.loads(out.stdout)
        assert created["token"].startswith("hs_") and created["run_prefix"] == "team-a-"
        r = httpx.post(srv.url + "/v1/runs/team-a-9/metrics", json=PUSH, headers=_bearer(created["token"]))
        assert r.status_code == 202
