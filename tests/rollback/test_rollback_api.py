"""The rollback answer and active bisection over HTTP, against a real server (uvicorn + SQLite).

The shared server runs in process on a fake clock (``conftest.py``); a test settles it before it
reads an answer, so the answer rests on every finding the pushes cause. The bisection's crash
test runs a server process of its own."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.both_stores

from simulation import GradSpike, LossSpike, NonFinite, simulate_run
from healthsvc.cli import main as cli_main
from healthsvc.settings import Settings

N_RANKS = 4


def push_run(http, run_id: str, faults=(), n_steps: int = 900, checkpoints=range(100, 900, 100),
             seed: int = 0) -> None:
    block = simulate_run(n_steps=n_steps, n_ranks=N_RANKS, seed=seed, faults=list(faults),
                         metrics=("loss", "grad_norm", "local_grad_norm", "lr")).block
    for start in range(0, n_steps, 300):
        rows = slice(start, min(start + 300, n_steps))
        steps = np.repeat(block.steps[rows], N_RANKS)
        ranks = np.tile(block.ranks, len(block.steps[rows]))
        cols = {"step": steps.tolist(), "rank": ranks.tolist()}
        for f in ("loss", "grad_norm", "local_grad_norm", "lr"):
            cols[f] = block.values[f][rows].reshape(-1).tolist()   # NaN stays a NaN token
        r = http.post(f"/v1/runs/{run_id}/metrics", content=json.dumps({"columns": cols}),
                      headers={"content-type": "application/json"})
        assert r.status_code == 202, r.text
    for c in checkpoints:
        r = http.post(f"/v1/runs/{run_id}/checkpoints", json={"step": c, "uri": f"mem://{run_id}/{c}"})
        assert r.status_code < 300, r.text


def settle(http) -> None:
    """Every step pushed so far judged by the detectors (the aligner's longest wait passed), and
    everything that caused stored: findings, alerts."""
    http.service.advance(Settings().align_timeout_s)


def wait_for_finding(http, run_id: str, kind: str) -> dict:
    """The first ``kind`` finding of the run, once the service has settled."""
    settle(http)
    found = http.get(f"/v1/runs/{run_id}/findings", params={"kind": kind}).json()
    assert found, f"no {kind} finding for {run_id}"
    return found[0]


def checkpoint_id(http, run_id: str, step: int) -> int:
    return next(c["id"] for c in http.get(f"/v1/runs/{run_id}/checkpoints").json() if c["step"] == step)


def test_a_clean_run_resumes_from_its_newest_checkpoint(shared_http):
    push_run(shared_http, "rb-clean")
    settle(shared_http)
    answer = shared_http.get("/v1/runs/rb-clean/rollback").json()
    assert answer["checkpoint"]["step"] == 800 and answer["checkpoint"]["uri"] == "mem://rb-clean/800"
    assert answer["onset"] is None and answer["findings"] == []
    assert "No corruption" in answer["reason"]


def test_a_nan_rolls_back_to_the_newest_checkpoint_before_the_onset(shared_http):
    push_run(shared_http, "rb-nan", [NonFinite(step=650, rank=2)])
    wait_for_finding(shared_http, "rb-nan", "non_finite")
    answer = shared_http.get("/v1/runs/rb-nan/rollback").json()
    assert answer["onset"]["step"] == 650 and answer["onset"]["low"] == 650
    assert answer["checkpoint"]["step"] == 600
    assert answer["findings"] and answer["findings"][0]["kind"] == "non_finite"
    assert answer["evidence"]["origin"] == "hardware" and answer["evidence"]["ranks"] == [2]
    # A deleted checkpoint is never recommended.
    cid = checkpoint_id(shared_http, "rb-nan", 600)
    assert shared_http.patch(f"/v1/runs/rb-nan/checkpoints/{cid}", json={"status": "deleted"}).status_code == 200
    again = shared_http.get("/v1/runs/rb-nan/rollback").json()
    assert again["checkpoint"]["step"] == 500 and "deleted" in again["reason"]


def test_bisection_narrows_persists_and_becomes_the_rollback_evidence(server, http):
    push_run(http, "rb-bisect", n_steps=400, checkpoints=range(100, 900, 100))
    r = http.post("/v1/runs/rb-bisect/bisection", json={"steps": [100, 200, 300, 400, 500, 600, 700, 800]})
    assert r.status_code == 201, r.text
    first = r.json()["next_probe"]["step"]
    http.post("/v1/runs/rb-bisect/bisection/reports", json={"step": first, "good": True, "value": 2.1})

    server.kill()                          # the state survives a crash
    server.start()
    status = http.get("/v1/runs/rb-bisect/bisection").json()
    assert status["probes"] == 1 and status["last_good"] == first

    probes = 1
    while not status["done"]:
        step = status["next_probe"]["step"]
        status = http.post("/v1/runs/rb-bisect/bisection/reports",
                           json={"step": step, "good": step <= 600}).json()
        probes += 1
    assert (status["last_good"], status["first_bad"]) == (600, 700)
    assert probes <= 4                     # ceil(log2(8 + 1))

    # A contradictory report is refused with both checkpoints named.
    r = http.post("/v1/runs/rb-bisect/bisection/reports", json={"step": 200, "good": False})
    assert r.status_code == 409 and "checkpoint 200 reported bad" in r.json()["detail"][0]["msg"]

    # Probe verdicts land on the checkpoints, and the rollback answer rests on them.
    statuses = {c["step"]: c["status"] for c in http.get("/v1/runs/rb-bisect/checkpoints").json()}
    assert statuses[first] == "verified" and statuses[700] == "bad"
    answer = http.get("/v1/runs/rb-bisect/rollback").json()
    assert answer["checkpoint"]["step"] == 600 and "verified good" in answer["reason"]

    assert http.delete("/v1/runs/rb-bisect/bisection").json() == {"ok": True}
    assert http.get("/v1/runs/rb-bisect/bisection").status_code == 404


def test_bisection_refuses_unknown_checkpoints_and_unproposed_reports(shared_http):
    push_run(shared_http, "rb-bad-input", n_steps=300, checkpoints=(100, 200, 300))
    r = shared_http.post("/v1/runs/rb-bad-input/bisection", json={"steps": [100, 150]})
    assert r.status_code == 422 and "150" in r.json()["detail"][0]["msg"]
    st = shared_http.post("/v1/runs/rb-bad-input/bisection", json={}).json()
    other = 100 if st["next_probe"]["step"] != 100 else 300
    r = shared_http.post("/v1/runs/rb-bad-input/bisection/reports", json={"step": other, "good": True})
    assert r.status_code == 409 and "was not proposed" in r.json()["detail"][0]["msg"]
    assert shared_http.get("/v1/runs/no-such-run/rollback").status_code == 404


def test_cli_prints_the_target_and_drives_a_bisection(shared_server, shared_http, capsys):
    # The loss jumps at step 651 and stays up: the update of step 650 is the first corrupted one.
    push_run(shared_http, "rb-cli", [LossSpike(step=651, factor=2.0, duration=200)])
    wait_for_finding(shared_http, "rb-cli", "loss_spike")
    assert cli_main(["rollback", "rb-cli", "--url", shared_server.url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "mem://rb-cli/600"       # first line: the URI alone, for scripts
    assert any(line.startswith("onset:      step 650") for line in out)
    assert cli_main(["bisect", "start", "rb-cli", "--steps", "100", "200", "300", "400",
                     "--url", shared_server.url]) == 0
    assert "probe checkpoint" in capsys.readouterr().out
    step = shared_http.get("/v1/runs/rb-cli/bisection").json()["next_probe"]["step"]
    assert cli_main(["bisect", "report", "rb-cli", str(step), "good", "--url", shared_server.url]) == 0
    assert cli_main(["bisect", "report", "rb-cli", "100", "bad", "--url", shared_server.url]) == 1
    assert "409" in capsys.readouterr().err


def test_checkpoints_of_an_abandoned_branch_are_never_recommended(shared_http):
    push_run(shared_http, "rb-branch", n_steps=900, checkpoints=range(100, 900, 100))
    # Resume from checkpoint 400: steps 401.. are reported again, as a new attempt.
    cols = {"step": [401, 401, 402, 402], "rank": [0, 1, 0, 1], "loss": [2.0] * 4}
    assert shared_http.post("/v1/runs/rb-branch/metrics", json={"columns": cols}).status_code == 202
    settle(shared_http)
    answer = shared_http.get("/v1/runs/rb-branch/rollback").json()
    assert answer["checkpoint"]["step"] == 400
    assert answer["evidence"]["superseded"] == [500, 600, 700, 800]
    shared_http.post("/v1/runs/rb-branch/checkpoints", json={"step": 500, "uri": "mem://rb-branch/500b"})
    answer = shared_http.get("/v1/runs/rb-branch/rollback").json()
    assert answer["checkpoint"]["uri"] == "mem://rb-branch/500b"


def test_the_rollback_target_reaches_the_run_summary_and_the_alert(shared_http):
    for c in range(100, 700, 100):   # checkpoints first: the alert is annotated when it fires
        shared_http.post("/v1/runs/rb-alert/checkpoints", json={"step": c, "uri": f"mem://rb-alert/{c}"})
    push_run(shared_http, "rb-alert", [NonFinite(step=650, rank=1)], checkpoints=())
    wait_for_finding(shared_http, "rb-alert", "non_finite")
    assert shared_http.get("/v1/runs/rb-alert").json()["rollback"]["step"] == 600
    alerts = shared_http.get("/v1/alerts", params={"run": "rb-alert", "kind": "non_finite"}).json()["alerts"]
    assert alerts and alerts[0]["rollback_target"]["step"] == 600


def wait_for_rollback(http, run_id: str, predicate) -> dict:
    """The rollback answer once the service has settled; ``predicate(answer)`` must hold."""
    settle(http)
    answer = http.get(f"/v1/runs/{run_id}/rollback").json()
    assert predicate(answer), f"rollback of {run_id} does not satisfy the condition: {answer}"
    return answer


def test_a_transient_spike_that_recovered_keeps_the_newest_checkpoint(shared_http):
    # A x50 gradient burst with a loss bump that is over within a few steps: recorded, not
    # evidence of corruption, so the run carries on from its newest checkpoint.
    push_run(shared_http, "rb-transient", [GradSpike(step=650, factor=50.0, loss_factor=2.0)])
    wait_for_finding(shared_http, "rb-transient", "grad_spike")
    answer = wait_for_rollback(shared_http, "rb-transient",
                               lambda a: any(e["kind"] == "grad_spike"
                                             for e in a["evidence"]["episodes"]))
    assert answer["checkpoint"]["step"] == 800 and answer["onset"] is None
    assert answer["findings"] == [] and "No corruption" in answer["reason"]
    spikes = [e for e in answer["evidence"]["episodes"] if e["kind"] == "grad_spike"]
    assert spikes and not any(e["evidence"] for e in spikes)
    # Recorded as info, or warned and back within steps: either way no evidence.
    assert all(e["why"] == "info only" or "recovered" in e["why"] for e in spikes)


def _push_rows(http, run_id: str, steps, loss: float | list[float], n_ranks: int = N_RANKS) -> None:
    losses = loss if isinstance(loss, list) else [loss] * len(steps)
    cols = {"step": [s for s in steps for _ in range(n_ranks)],
            "rank": [r for _ in steps for r in range(n_ranks)],
            "loss": [v for v in losses for _ in range(n_ranks)]}
    r = http.post(f"/v1/runs/{run_id}/metrics", json={"columns": cols})
    assert r.status_code == 202, r.text


def _blow_up(http, run_id: str, first: int, seed: int) -> None:
    """The loss back at its initialisation level (ln(50k) ~ 11) for 80 steps from ``first``."""
    rng = np.random.default_rng(seed)
    _push_rows(http, run_id, range(first, first + 80),
               [float(v) for v in 10.8 * np.exp(rng.normal(0, 0.01, 80))])


def test_a_blow_up_right_after_a_restart_resumes_from_the_restored_checkpoint(shared_http):
    # Pythia-style: trained to 400, crashed, resumed from checkpoint 400 (the restart event names
    # the first step after the restore, as a replay of records does), and the loss is back at its
    # initialisation level from that very step: the restore is to blame, not checkpoint 400.
    push_run(shared_http, "rb-restore", n_steps=401, checkpoints=range(100, 401, 100))
    r = shared_http.post("/v1/runs/rb-restore/events", json={"kind": "restart", "step": 401})
    assert r.status_code < 300, r.text
    _blow_up(shared_http, "rb-restore", 401, seed=5)
    answer = wait_for_rollback(shared_http, "rb-restore", lambda a: a["onset"] is not None)
    assert answer["checkpoint"]["step"] == 400, answer["reason"]
    assert answer["evidence"]["resumed_from"] == 400
    assert answer["evidence"]["restart_first_step"] == 401
    assert "restore" in answer["reason"]


def test_a_restart_event_naming_the_checkpoint_is_read_as_the_checkpoint(shared_http):
    # examples/train.py reports the restart with step = the checkpoint it resumed from.
    push_run(shared_http, "rb-restart-ev", n_steps=501, checkpoints=range(100, 501, 100))
    r = shared_http.post("/v1/runs/rb-restart-ev/events", json={"kind": "restart", "step": 500})
    assert r.status_code < 300, r.text
    _blow_up(shared_http, "rb-restart-ev", 501, seed=6)
    answer = wait_for_rollback(shared_http, "rb-restart-ev", lambda a: a["onset"] is not None)
    assert answer["checkpoint"]["step"] == 500, answer["reason"]
    assert answer["evidence"]["resumed_from"] == 500


def test_the_answer_reads_only_the_history_near_the_evidence(shared_http):
    # A NaN late in a long run: the estimate needs the window around it (and the samples its
    # trend is learned from), not the whole run, so the answer's memory is bounded by the window
    # (a 16k-rank run is 160 M records).
    push_run(shared_http, "rb-long", [NonFinite(step=5_800, rank=1)], n_steps=6_000,
             checkpoints=range(500, 6_000, 500))
    wait_for_finding(shared_http, "rb-long", "non_finite")
    answer = shared_http.get("/v1/runs/rb-long/rollback").json()
    assert answer["checkpoint"]["step"] == 5_500
    read = answer["evidence"]["history_steps"]
    assert 0 < read <= 5_800 + 64 - (5_800 - 32 - 4 * 512 - 64) + 1 < 6_000


def test_an_answer_without_fingerprints_says_it_rests_on_no_proof(shared_http):
    push_run(shared_http, "rb-no-digest")
    settle(shared_http)
    answer = shared_http.get("/v1/runs/rb-no-digest/rollback").json()
    assert answer["checkpoint"]["step"] == 800
    assert answer["fingerprints"] is False and answer["proof"] is None
    note = answer["proof_note"]
    assert "silent corruption of a replica" in note and "cannot be excluded" in note
    assert "fingerprint(model)" in note and answer["reason"].endswith(note)


def test_an_answer_with_fingerprints_carries_the_proof(shared_http):
    # A clean run whose records carry, every 20 steps, each rank's parameter digest: rank 1's
    # differs from step 700 on.
    block = simulate_run(n_steps=900, n_ranks=N_RANKS, seed=0, metrics=("loss", "grad_norm")).block
    records = []
    for i, s in enumerate(block.steps.tolist()):
        for r in range(N_RANKS):
            rec = {"step": s, "rank": r, "loss": float(block.values["loss"][i, r]),
                   "grad_norm": float(block.values["grad_norm"][i, r])}
            if s % 20 == 0:
                rec["param_digest"] = "flipped" if (r == 1 and s >= 700) else f"d{s}"
            records.append(rec)
    for start in range(0, len(records), 1_200):
        r = shared_http.post("/v1/runs/rb-digest/metrics", json={"records": records[start:start + 1_200]})
        assert r.status_code == 202, r.text
    for c in range(100, 900, 100):
        shared_http.post("/v1/runs/rb-digest/checkpoints", json={"step": c, "uri": f"mem://rb-digest/{c}"})
    settle(shared_http)
    answer = shared_http.get("/v1/runs/rb-digest/rollback").json()
    assert answer["fingerprints"] is True and answer["proof_note"] is None
    assert answer["proof"] == {"last_agreeing_step": 680, "first_disagreeing_step": 700, "ranks": [1]}
    assert answer["checkpoint"]["step"] == 600 and answer["proven_clean"] is True
    assert "no replica fingerprints" not in answer["reason"]


def test_a_fingerprint_row_that_came_late_still_proves_its_checkpoint_clean(shared_http):
    # Three replicas send digests every 5 steps; the checkpoint of step 9 is the newest before a
    # bit flip in rank 2 after step 13's update. Rank 2's record of step 9 reaches the service
    # after the monitor stopped waiting for it (a loaded machine: the sender thread of one rank
    # starved for longer than align_timeout_s), so the detector judged step 9 without it and
    # its finding says the replicas last agreed at step 4. The store holds the whole row by the
    # time anyone asks: the answer must rest on that, not on the detector's partial view.
    run = "rb-digest-late"

    def record(step: int, rank: int) -> dict:
        rec = {"step": step, "rank": rank, "loss": 2.0 - 0.01 * step, "grad_norm": 1.0}
        if step % 5 == 4:
            rec["param_digest"] = "flipped" if (rank == 2 and step >= 14) else f"d{step}"
        return rec

    def push(records: list[dict]) -> None:
        r = shared_http.post(f"/v1/runs/{run}/metrics", json={"records": records})
        assert r.status_code == 202, r.text

    push([record(s, r) for s in range(9) for r in range(3)] + [record(9, 0), record(9, 1)])
    settle(shared_http)                       # step 9 is judged with rank 2 missing
    push([record(9, 2)])                      # ... whose record then comes, late
    push([record(s, r) for s in range(10, 20) for r in range(3)])
    for c in (4, 9, 19):
        assert shared_http.post(f"/v1/runs/{run}/checkpoints",
                                json={"step": c, "uri": f"mem://{run}/{c}"}).status_code < 300
    found = wait_for_finding(shared_http, run, "replica_mismatch")
    assert (found["step"], found["ranks"], found["evidence"]["last_agreeing_step"]) == (14, [2], 4)
    answer = shared_http.get(f"/v1/runs/{run}/rollback").json()
    assert answer["proof"] == {"last_agreeing_step": 9, "first_disagreeing_step": 14, "ranks": [2]}
    assert answer["checkpoint"]["step"] == 9 and answer["proven_clean"] is True, answer["reason"]
