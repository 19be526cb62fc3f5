"""GET /v1/runs/{run_id}/action and the run's supervise policy, over HTTP against a real server
(uvicorn on 127.0.0.1 in this process, SQLite, a fake clock; both stores)."""
from __future__ import annotations

import json

import pytest

from tests.harness import ServedService
from tests.pg import database_for

pytestmark = pytest.mark.both_stores

HOSTS = ["n0", "n0", "n1", "n1"]


@pytest.fixture(scope="module")
def svc(tmp_path_factory, db_kind):
    directory = tmp_path_factory.mktemp("supervise")
    with database_for(db_kind, directory) as db, ServedService(directory, db=db) as service:
        yield service


def push(http, run_id, steps, nan_at=None, incarnation="a"):
    records = [{"step": s, "rank": r, "host": HOSTS[r], "incarnation": f"{incarnation}{r}",
                "loss": "NaN" if (s, r) == nan_at else 2.0 - s * 1e-3, "grad_norm": 1.0,
                "local_grad_norm": "NaN" if (s, r) == nan_at else 1.0}
               for s in steps for r in range(4)]
    r = http.post(f"/v1/runs/{run_id}/metrics", content=json.dumps({"records": records}),
                  headers={"content-type": "application/json"})
    assert r.status_code == 202, r.text


def action(http, run_id, **params) -> dict:
    r = http.get(f"/v1/runs/{run_id}/action", params=params)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("supervise,loc,words", [
    ({"restart_on": {"resume_mismatch": "warning"}}, ["body", "supervise", "restart_on"], "restore"),
    ({"restart_on": {"bitrot": "warning"}}, ["body", "supervise", "restart_on"], "unknown finding kind"),
    ({"restart_on": {"hang": "severe"}}, ["body", "supervise", "restart_on", "hang"], "info"),
    ({"leave_out_kinds": ["nope"]}, ["body", "supervise", "leave_out_kinds"], "unknown finding kind"),
    ({"max_restarts": -1}, ["body", "supervise", "max_restarts"], "greater than or equal"),
    ({"max_restarts": 2.5}, ["body", "supervise", "max_restarts"], "integer"),
    ({"cooldown_s": -1}, ["body", "supervise", "cooldown_s"], "greater than or equal"),
    ({"budget": 3}, ["body", "supervise", "budget"], "Extra inputs"),
])
def test_a_bad_policy_is_a_422_naming_the_field(svc, supervise, loc, words):
    r = svc.http.put("/v1/runs/sv-bad", json={"supervise": supervise})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == loc and words in detail["msg"], detail


def test_the_policy_is_stored_with_the_run_and_decides(svc):
    http = svc.http
    policy = {"restart_on": {"straggler": "info"}, "max_restarts": 1, "cooldown_s": 5.0,
              "leave_out_kinds": ["straggler"], "restart_on_crash": False}
    r = http.put("/v1/runs/sv-policy", json={"world_size": 4, "supervise": policy})
    assert r.status_code == 200, r.text
    assert http.get("/v1/runs/sv-policy").json()["config"]["supervise"] == policy
    push(http, "sv-policy", range(10))
    http.post("/v1/runs/sv-policy/checkpoints", json={"step": 5, "uri": "mem://5"})
    svc.drain()
    a = action(http, "sv-policy", exited=1)
    assert (a["action"], a["reason"], a["max_restarts"]) == ("stop", "crash_not_restarted", 1)


def test_nan_then_restart_then_the_new_attempt(svc):
    http, run = svc.http, "sv-nan"
    assert http.put(f"/v1/runs/{run}", json={"world_size": 4}).status_code == 200
    for c in (49, 99):
        http.post(f"/v1/runs/{run}/checkpoints", json={"step": c, "uri": f"mem://{run}/{c}"})
    push(http, run, range(120))
    svc.drain()
    assert (a := action(http, run))["action"] == "continue" and a["reason"] == "healthy"
    assert a["checkpoint"] is None and a["event"] is None

    push(http, run, range(120, 125), nan_at=(120, 2))
    svc.drain()
    a = action(http, run)
    assert (a["action"], a["reason"]) == ("restart", "finding"), a
    assert a["checkpoint"] == {"step": 99, "uri": f"mem://{run}/99", "id": a["checkpoint"]["id"],
                               "proven_clean": False}
    assert a["exclude_hosts"] == [] and a["world_size"] == {"old": 4, "new": 4, "changes": False,
                                                            "ranks_by_host": {}}
    assert {f["kind"] for f in a["findings"]} == {"non_finite"} and a["message"].startswith(
        "Restart from step 99")
    event = a["event"]
    assert event["kind"] == "rollback" and event["step"] == 99
    assert event["data"]["decided_by"] == "healthsvc supervise" and event["data"]["from_attempt"] == 1

    r = http.post(f"/v1/runs/{run}/events", json=event)
    assert r.status_code < 300, r.text
    a = action(http, run)
    assert (a["action"], a["reason"], a["restarts_used"]) == ("continue", "restart_pending", 1)

    push(http, run, range(100, 130), incarnation="b")       # the resumed job: attempt 2
    svc.drain()
    a = action(http, run)
    assert (a["action"], a["reason"], a["attempt"]) == ("continue", "healthy", 2), a
    # The restart is on the run's timeline with the decision's sentence.
    entries = http.get(f"/v1/runs/{run}/timeline", params={"findings": "false"}).json()["entries"]
    assert [(e["step"], e["reason"]) for e in entries if e.get("event_kind") == "rollback"] == [
        (99, event["data"]["reason"])]


def test_a_crash_restarts_from_the_newest_checkpoint_and_the_budget_ends_it(svc):
    http, run = svc.http, "sv-crash"
    http.put(f"/v1/runs/{run}", json={"supervise": {"max_restarts": 1, "cooldown_s": 0}})
    push(http, run, range(30))
    http.post(f"/v1/runs/{run}/checkpoints", json={"step": 19, "uri": "mem://19"})
    svc.drain()
    a = action(http, run, exited=1)
    assert (a["action"], a["reason"], a["checkpoint"]["step"]) == ("restart", "crash", 19)
    assert a["findings"] == [] and a["event"]["kind"] == "restart"
    assert http.post(f"/v1/runs/{run}/events", json=a["event"]).status_code < 300
    a = action(http, run, exited=-9)
    assert (a["action"], a["reason"]) == ("stop", "budget_spent"), a


def test_unknown_run_and_bad_exit_status(svc):
    r = svc.http.get("/v1/runs/sv-none/action")
    assert r.status_code == 404 and r.json()["detail"][0]["loc"] == ["path", "run_id"]
    r = svc.http.get("/v1/runs/sv-policy/action", params={"exited": "x"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "exited"]


def test_every_field_of_the_answer_is_documented(svc):
    schema = svc.http.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    for name in ("ActionOut", "ActionCheckpoint", "WorldSize", "ActionFinding", "RestartEvent",
                 "RestartEventData", "SuperviseConfig"):
        props = components[name]["properties"]
        undocumented = [p for p, spec in props.items() if not spec.get("description")]
        assert undocumented == [], (name, undocumented)
    assert "/v1/runs/{run_id}/action" in schema["paths"]
