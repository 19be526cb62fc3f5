"""A kind declared in its own module and registry entry only (tests/kinds/toy_detector.py) is
served like a built-in one: it is configurable, it fires, it alerts as its kind says (latched),
it counts as rollback evidence, it shows on the dashboard and in ``GET /v1/kinds``. Real uvicorn
on 127.0.0.1 and a real SQLite file; the service is built after the registration, as a process
that imports a plug-in's module before it starts would be."""
from __future__ import annotations

import json

import pytest

from healthsvc_detectors import kinds
from healthsvc_detectors.registry import REGISTRY, register, unregister
from healthsvc.settings import Settings
from tests.harness import ServedService
from tests.kinds.toy_detector import ENTRY

RUN = "toy-run"
RANKS = 4
JSON = {"content-type": "application/json"}


@pytest.fixture
def toy_service(tmp_path):
    register(ENTRY)
    try:
        with ServedService(tmp_path) as svc:
            yield svc
    finally:
        unregister("toy")
    assert "toy" not in REGISTRY and not kinds.known("toy")


def push(http, steps, loss_of) -> None:
    cols = {"step": [s for s in steps for _ in range(RANKS)], "rank": [r for _ in steps for r in range(RANKS)]}
    cols["loss"] = [loss_of(s, r) for s in steps for r in range(RANKS)]
    cols["grad_norm"] = [1.0 for _ in cols["step"]]
    r = http.post(f"/v1/runs/{RUN}/metrics", content=json.dumps({"columns": cols}), headers=JSON)
    assert r.status_code == 202, r.text


def test_a_kind_declared_in_its_own_module_alerts_counts_as_evidence_and_is_configurable(toy_service):
    http = toy_service.http
    listed = {k["name"]: k for k in http.get("/v1/kinds").json()}
    assert listed["toy"]["resolves"] == "latched" and listed["toy"]["corruption"] == "abrupt"
    assert listed["toy"]["colour"] == "#123456"

    # Configurable: typed and ranged from its constructor, like every detector's parameters.
    bad = http.put(f"/v1/runs/{RUN}", json={"detectors": {"toy": {"threshold": "high"}}})
    assert bad.status_code == 422 and "threshold" in bad.text
    assert http.put(f"/v1/runs/{RUN}", json={"detectors": {"toy": {"threshold": 50.0}}}).status_code == 200

    # Rank 2's loss reaches 60 at step 250: over the configured threshold, under the default.
    push(http, range(0, 300), lambda s, r: 60.0 if (s, r) == (250, 2) else 1.0)
    for c in (100, 200, 280):
        assert http.post(f"/v1/runs/{RUN}/checkpoints", json={"step": c, "uri": f"mem://{c}"}).status_code < 300
    toy_service.advance(Settings().align_timeout_s)

    found = http.get(f"/v1/runs/{RUN}/findings", params={"kind": "toy"}).json()
    assert [(f["kind"], f["step"], f["ranks"], f["severity"]) for f in found] == [("toy", 250, [2], "critical")]

    (alert,) = [a for a in http.get("/v1/alerts", params={"run": RUN}).json()["alerts"] if a["labels"]["alertname"] == "toy"]
    assert alert["status"] == "firing" and alert["latched"]
    toy_service.advance(2 * 300.0, step_s=60.0)   # past the resolve timeout: latched, it stays
    (alert,) = [a for a in http.get("/v1/alerts", params={"run": RUN}).json()["alerts"] if a["labels"]["alertname"] == "toy"]
    assert alert["status"] == "firing"

    # Evidence of corruption at 250: the answer is the checkpoint before it, not the newest.
    answer = http.get(f"/v1/runs/{RUN}/rollback").json()
    assert answer["checkpoint"]["step"] == 200, answer
    assert [e["kind"] for e in answer["evidence"]["episodes"] if e["evidence"]] == ["toy"]

    # The dashboard's run list names it among the run's active kinds.
    (row,) = [r for r in http.get("/v1/dashboard/runs").json() if r["run_id"] == RUN]
    assert "toy" in row["active_kinds"]
