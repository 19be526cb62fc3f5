"""The cap on runs per token (issue 25, point 1: "limits ... on runs per token"): the runs a token's
requests create are counted against it (``max_runs_per_token``), so one team's token cannot fill
the service's ``max_runs`` alone. A creation beyond is a 429 that names the limit, the setting
and the token; the token's existing runs go on, another token's count is its own, an admin token
is held by ``max_runs`` only, and the count survives a restart. Against a real server process
with two tokens, on both stores."""
from __future__ import annotations

import httpx
import pytest

from tests.server_process import ServerProcess

pytestmark = pytest.mark.both_stores

PER_TOKEN = 2
ADMIN = "bootstrap-admin-secret"


def push(c: httpx.Client, token: str, run: str, step: int = 0) -> httpx.Response:
    return c.post(f"/v1/runs/{run}/metrics", headers={"authorization": f"Bearer {token}"},
                  json={"records": [{"step": step, "rank": 0, "loss": 1.0}]})


def assert_capped(answer: httpx.Response, name: str) -> None:
    assert answer.status_code == 429, answer.text
    (item,) = answer.json()["detail"]
    assert item["loc"] == ["path", "run_id"]
    assert f"limit of {PER_TOKEN} runs per token" in item["msg"] and f"token {name!r}" in item["msg"], item
    assert "(setting max_runs_per_token)" in item["msg"] and "HEALTHSVC_MAX_RUNS_PER_TOKEN" in item["hint"]


def test_a_token_creates_at_most_its_quota_of_runs_and_the_answer_names_it(tmp_path, db_uri):
    env = {"HEALTHSVC_MAX_RUNS_PER_TOKEN": str(PER_TOKEN), "HEALTHSVC_ADMIN_TOKEN": ADMIN}
    admin = {"authorization": f"Bearer {ADMIN}"}
    with ServerProcess(db_uri, env=env, log_path=tmp_path / "server.log") as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as c:
        a, b = (c.post("/v1/tokens", headers=admin, json={"name": n, "scopes": ["ingest", "read"]}).json()["token"]
                for n in ("team-a", "team-b"))
        assert push(c, a, "a1").status_code == 202
        bearer_a = {"authorization": f"Bearer {a}"}
        assert c.post("/v1/runs/a2/heartbeats", headers=bearer_a, json={"rank": 0, "step": 0}).status_code < 300
        for answer in (push(c, a, "a3"),
                       c.post("/v1/runs/a3/heartbeats", headers=bearer_a, json={"rank": 0, "step": 0}),
                       c.post("/v1/runs/a3/checkpoints", headers=bearer_a, json={"step": 1, "uri": "s3://x/1"})):
            assert_capped(answer, "team-a")
        assert c.get("/v1/runs/a3", headers=admin).status_code == 404     # no trace of the refused run
        assert push(c, a, "a1", step=1).status_code == 202               # its runs go on
        # team-b's count is its own; pushing to a run team-a made is no creation.
        assert push(c, b, "a1", step=2).status_code == 202
        assert push(c, b, "b1").status_code == 202 and push(c, b, "b2").status_code == 202
        assert_capped(push(c, b, "b3"), "team-b")
        assert push(c, ADMIN, "ops1").status_code == 202                # an admin is held by max_runs only

    with ServerProcess(db_uri, env=env, log_path=tmp_path / "server.log") as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as c:
        assert_capped(push(c, a, "a4"), "team-a")                       # counted in the store: kept
        assert push(c, a, "a2", step=0).status_code == 202
