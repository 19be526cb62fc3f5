"""Replay probes over HTTP against a real server: asked for, polled by the trainer's helper
(``healthsvc_client.probe``), reported by two ranks, decided; bad input named."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.both_stores

import healthsvc_client
from healthsvc_client.probe import next_probe, report_probe
from tests.barriers import wait_until


@pytest.fixture
def http(shared_http):
    """One server for the module: every test uses its own run ids."""
    return shared_http


def push(http, run: str, hosts=("node-a", "node-b", "node-c")) -> None:
    records = [{"step": s, "rank": r, "loss": 1.0, "host": hosts[r]} for s in range(3) for r in range(3)]
    assert http.post(f"/v1/runs/{run}/metrics", json={"records": records}).status_code == 202


def test_a_probe_is_polled_reported_by_both_ranks_and_blames_the_suspects_host(shared_server, http):
    push(http, "pr-hw")
    asked = http.post("/v1/runs/pr-hw/probes", json={"suspect_rank": 2, "reason": "replica_mismatch"})
    assert asked.status_code == 201, asked.text
    probe = asked.json()
    assert (probe["status"], probe["suspect_rank"], probe["healthy_rank"], probe["step"]) == ("pending", 2, 0, 2)
    assert probe["host"] == "node-c" and probe["verdict"] is None

    # The trainer's side: rank 0 polls, the two ranks report.
    run = healthsvc_client.Run(shared_server.url, "pr-hw", rank=0, heartbeat_interval_s=0, flush_interval_s=0.05)
    taken = next_probe(run)
    assert taken["id"] == probe["id"]
    assert next_probe(run) is None                       # taken already: not handed out twice
    report_probe(run, taken["id"], 2, 3.25)
    report_probe(run, taken["id"], 0, 1.5)
    assert run.flush(10.0)
    done = wait_until(lambda: (p := http.get(f"/v1/runs/pr-hw/probes/{probe['id']}").json())["status"] == "done" and p)
    assert done["verdict"] == "hardware" and done["reports"] == {"2": 3.25, "0": 1.5}
    assert "node-c" in done["explanation"] and "hardware" in done["explanation"]
    assert http.get("/v1/runs/pr-hw/probes/next").status_code == 204   # nothing pending
    assert [p["id"] for p in http.get("/v1/runs/pr-hw/probes").json()] == [probe["id"]]
    run.finish(5.0)


def test_the_same_norm_on_both_ranks_points_at_the_data(http):
    push(http, "pr-data")
    pid = http.post("/v1/runs/pr-data/probes", json={"suspect_rank": 1, "healthy_rank": 2, "step": 1}).json()["id"]
    assert http.get("/v1/runs/pr-data/probes/next", params={"upto_step": 0}).status_code == 204  # not reached
    assert http.get("/v1/runs/pr-data/probes/next", params={"after": 0, "upto_step": 1}).json()["id"] == pid
    assert http.post(f"/v1/runs/pr-data/probes/{pid}/reports", json={"rank": 1, "grad_norm": 0.75}).json()["status"] == "pending"
    done = http.post(f"/v1/runs/pr-data/probes/{pid}/reports", json={"rank": 2, "grad_norm": 0.75}).json()
    assert done["verdict"] == "data_or_code" and "data of that step or the code" in done["explanation"]
    # A retried report is fine; a different one after the verdict contradicts it.
    assert http.post(f"/v1/runs/pr-data/probes/{pid}/reports", json={"rank": 2, "grad_norm": 0.75}).status_code == 200
    assert http.post(f"/v1/runs/pr-data/probes/{pid}/reports", json={"rank": 2, "grad_norm": 0.8}).status_code == 409


def test_a_probe_from_a_finding_takes_its_rank_and_step(http):
    push(http, "pr-finding")
    records = [{"step": 3, "rank": r, "loss": float("nan") if r == 1 else 1.0} for r in range(3)]
    http.post("/v1/runs/pr-finding/metrics", content=healthsvc_client.encode.encode_json({"records": records}))
    finding = wait_until(lambda: http.get("/v1/runs/pr-finding/findings", params={"kind": "non_finite"}).json())[0]
    probe = http.post("/v1/runs/pr-finding/probes", json={"finding_id": finding["id"]}).json()
    assert (probe["suspect_rank"], probe["healthy_rank"], probe["step"], probe["finding_id"]) == (1, 0, 3, finding["id"])


@pytest.mark.parametrize("body, loc", [
    ({}, ["body", "suspect_rank"]),
    ({"suspect_rank": 1, "healthy_rank": 1}, ["body", "healthy_rank"]),
    ({"suspect_rank": -1}, ["body", "suspect_rank"]),
    ({"finding_id": 999}, ["body", "finding_id"]),
    ({"suspect_rank": 1, "extra": 1}, ["body", "extra"]),
])
def test_bad_requests_name_the_field(http, body, loc):
    push(http, "pr-bad")
    r = http.post("/v1/runs/pr-bad/probes", json=body)
    assert 400 <= r.status_code < 500 and r.json()["detail"][0]["loc"] == loc, r.text


def test_bad_reports_name_the_field(http):
    push(http, "pr-badrep")
    pid = http.post("/v1/runs/pr-badrep/probes", json={"suspect_rank": 1}).json()["id"]
    r = http.post(f"/v1/runs/pr-badrep/probes/{pid}/reports", json={"rank": 2, "grad_norm": 1.0})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rank"]
    r = http.post(f"/v1/runs/pr-badrep/probes/{pid}/reports", json={"rank": 1, "grad_norm": "big"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "grad_norm"]
    assert http.post("/v1/runs/pr-badrep/probes/77/reports", json={"rank": 1, "grad_norm": 1.0}).status_code == 404
    assert http.get("/v1/runs/nope/probes/next").status_code == 404


def test_the_service_asks_for_a_probe_when_a_replica_disagrees(http):
    run = "pr-auto"
    assert http.put(f"/v1/runs/{run}", json={"world_size": 4}).status_code == 200
    records = [{"step": s, "rank": r, "loss": 1.0, "host": f"node-{r}",
                "param_digest": "bad" if (r == 3 and s == 9) else f"d{s}"} for s in range(10) for r in range(4)]
    assert http.post(f"/v1/runs/{run}/metrics", json={"records": records}).status_code == 202
    finding = wait_until(lambda: http.get(f"/v1/runs/{run}/findings", params={"kind": "replica_mismatch"}).json())[0]
    assert (finding["step"], finding["ranks"], finding["hosts"]) == (9, [3], ["node-3"])
    probe = wait_until(lambda: http.get(f"/v1/runs/{run}/probes").json())[0]
    assert (probe["suspect_rank"], probe["healthy_rank"], probe["step"], probe["finding_id"]) == (3, 0, 9, finding["id"])
    assert probe["host"] == "node-3" and "replica_mismatch" in probe["reason"]
