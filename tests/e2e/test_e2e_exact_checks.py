"""End to end, the exact checks: examples/train.py (4 gloo ranks on the CPU) against a real server.

- A bit flipped in one replica's weights, or in its optimizer state: ``replica_mismatch`` names
  the rank and its host at the first fingerprint after the flip, and the rollback is the newest
  checkpoint at or before the last step the replicas agreed, clean by proof.
- Replay probes asked for before the training (for steps it will reach): the example trainer
  answers them; before the flip both ranks compute the same norm (the data or the code), after it
  they do not (the hardware of the suspect, whose host is named).
- Resumes: an honest one raises nothing; one with the sampler and the schedule restarted raises a
  ``resume_mismatch`` for each, with both values, at the first step after the resume.

One training per scenario, 40-50 steps. The clean run with fingerprints on is in
test_e2e_training.py (its healthy run sends them by default and must raise nothing).
"""
from __future__ import annotations

import socket

import pytest

from tests.barriers import wait_until
from tests.e2e.test_e2e_training import all_findings, configure, train

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

HOST = socket.gethostname()
EXACT = ("--steps", "40", "--fingerprint-every", "5", "--ckpt-every", "10")


@pytest.fixture(scope="module")
def url(shared_server) -> str:
    return shared_server.url


def replica_findings(http, run_id: str) -> list[dict]:
    return wait_until(lambda: [f for f in all_findings(http, run_id) if f["kind"] == "replica_mismatch"],
                      what=f"a replica_mismatch in {run_id}")


def assert_proven_rollback(http, run_id: str, last_agreeing: int, first_disagreeing: int, rank: int) -> None:
    answer = http.get(f"/v1/runs/{run_id}/rollback").json()
    assert answer["checkpoint"]["step"] == last_agreeing and answer["proven_clean"] is True
    assert (answer["onset"]["low"], answer["onset"]["high"], answer["onset"]["confidence"]) == (
        last_agreeing + 1, first_disagreeing, 1.0)
    assert answer["evidence"]["proof"] == {"last_agreeing_step": last_agreeing,
                                           "first_disagreeing_step": first_disagreeing, "ranks": [rank]}
    assert "clean by proof" in answer["reason"]


def test_a_weight_bit_flip_is_named_at_the_next_fingerprint_and_probes_tell_hardware_from_data(
        url, shared_http, tmp_path):
    run_id = "e2e-weight-flip"
    configure(shared_http, run_id)
    # Probes for steps the training will reach, oldest step first: rank 1 against rank 0 at step
    # 10 (before the flip) and rank 2 against rank 0 at step 30 (after it).
    before = shared_http.post(f"/v1/runs/{run_id}/probes", json={"suspect_rank": 1, "healthy_rank": 0, "step": 10})
    after = shared_http.post(f"/v1/runs/{run_id}/probes", json={"suspect_rank": 2, "healthy_rank": 0, "step": 30})
    assert before.status_code == after.status_code == 201, before.text + after.text
    train(url, run_id, tmp_path, *EXACT, "--fault", "weight_bitflip", "--fault-rank", "2",
          "--fault-step", "23", "--probe-every", "5")

    found = replica_findings(shared_http, run_id)
    assert [(f["step"], f["ranks"], f["hosts"], f["severity"]) for f in found] == [(24, [2], [HOST], "critical")]
    assert (found[0]["evidence"]["last_agreeing_step"], found[0]["evidence"]["first_disagreeing_step"]) == (19, 24)
    assert_proven_rollback(shared_http, run_id, 19, 24, 2)

    probes = {p["id"]: p for p in shared_http.get(f"/v1/runs/{run_id}/probes").json()}
    clean, flipped = probes[before.json()["id"]], probes[after.json()["id"]]
    assert clean["verdict"] == "data_or_code" and clean["reports"]["1"] == clean["reports"]["0"]
    assert flipped["verdict"] == "hardware" and flipped["host"] == HOST and HOST in flipped["explanation"]
    assert flipped["reports"]["2"] != flipped["reports"]["0"]


def test_an_optimizer_state_bit_flip_is_named_when_the_fingerprint_covers_the_optimizer(url, shared_http, tmp_path):
    # The flip lands in AdamW's second moment after the update of step 24, a fingerprint step:
    # the parameters are still identical there, only a fingerprint of the optimizer state sees it.
    run_id = "e2e-optim-flip"
    configure(shared_http, run_id)
    train(url, run_id, tmp_path, *EXACT, "--fingerprint-optimizer", "--fault", "optim_bitflip",
          "--fault-rank", "1", "--fault-step", "24")
    found = replica_findings(shared_http, run_id)
    assert [(f["step"], f["ranks"], f["hosts"]) for f in found] == [(24, [1], [HOST])]
    assert found[0]["evidence"]["last_agreeing_step"] == 19
    assert_proven_rollback(shared_http, run_id, 19, 24, 1)


def test_a_resume_must_continue_the_data_position_and_the_schedule(url, shared_http, tmp_path):
    run_id = "e2e-resume"
    configure(shared_http, run_id)
    common = ("--steps", "50", "--ckpt-every", "20", "--lr-schedule", "cosine")
    train(url, run_id, tmp_path, *common)                      # attempt 1: steps 0..49
    ckpt = str(tmp_path / f"ckpt-{run_id}" / "ckpt_000039.pt")
    train(url, run_id, tmp_path, *common, "--resume", ckpt)   # attempt 2: honest, 40..49
    wait_until(lambda: shared_http.get(f"/v1/runs/{run_id}").json()["attempt"] == 2
               and shared_http.get(f"/v1/runs/{run_id}").json()["status"] == "finished")
    train(url, run_id, tmp_path, *common, "--resume", ckpt,   # attempt 3: both restarted
          "--fault", "resume_sampler_reset,resume_scheduler_reset")

    found = wait_until(lambda: len(f := [f for f in all_findings(shared_http, run_id)
                                         if f["kind"] == "resume_mismatch"]) >= 2 and f,
                       what="two resume_mismatch findings")
    # The honest resume (attempt 2) raised nothing at all; the faulty one only the two mismatches.
    assert [f for f in all_findings(shared_http, run_id) if f["attempt"] == 2] == []
    by_metric = {f["metric"]: f for f in found}
    assert sorted(by_metric) == ["data_cursor", "lr"] and {f["attempt"] for f in found} == {3}
    assert {f["step"] for f in found} == {40} and {f["severity"] for f in found} == {"critical"}
    cursor = by_metric["data_cursor"]["evidence"]
    assert (cursor["expected"], cursor["got"], cursor["reference"]) == (41 * 8, 8, "abandoned_attempt")
    lr = by_metric["lr"]["evidence"]
    assert lr["got"] == pytest.approx(3e-3) and lr["expected"] == pytest.approx(3e-3 * 0.18594, rel=1e-3)
    # The rollback blames the restore: resume from the same checkpoint again, and fix the restore.
    answer = shared_http.get(f"/v1/runs/{run_id}/rollback").json()
    assert answer["checkpoint"]["step"] == 39 and answer["evidence"]["resumed_from"] == 39
