"""The Hugging Face callback on a real ``transformers.Trainer`` training a tiny randomly
initialised GPT-2 (no download) against a real server: per-step records, and checkpoints
registered with the time the save took and their size; then the same under torchrun with 2
processes (gloo): every field from every rank, and a resume that starts the data again caught."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tests.integrations.torchrun import skip_unless_installed, torchrun

skip_unless_installed("torch", "transformers")
pytestmark = [pytest.mark.timeout(300)]


def test_trainer_checkpoints_are_registered_with_durations(shared_server, shared_http, tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from healthsvc_client.hf import attach

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    ids = torch.randint(0, 64, (32, 16))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=1e-3, report_to=[], use_cpu=True, logging_steps=100,
                             save_strategy="steps", save_steps=2, disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    callback = attach(trainer, shared_server.url, run_id="hf-tiny", heartbeat_interval_s=0,
                      fingerprint_every=2)
    trainer.train()
    assert callback.run.stats().failed_requests == 0

    cols = shared_http.get("/v1/runs/hf-tiny/metrics").json()["columns"]
    assert cols["step"] == [1, 2, 3, 4] and cols["rank"] == [0] * 4
    assert all(math.isfinite(v) and v > 0 for v in cols["loss"] + cols["grad_norm"])
    assert cols["local_grad_norm"] == cols["grad_norm"]       # one process: no all-reduce
    assert cols["data_cursor"] == [4, 8, 12, 16]
    # A fingerprint every 2 steps, at the steps of the checkpoints; the weights moved in between.
    assert [d is not None for d in cols["param_digest"]] == [False, True, False, True]
    assert cols["param_digest"][1] != cols["param_digest"][3]

    ckpts = shared_http.get("/v1/runs/hf-tiny/checkpoints").json()
    assert [c["step"] for c in ckpts] == [2, 4]
    for c in ckpts:
        assert os.path.basename(c["uri"]) == f"checkpoint-{c['step']}" and os.path.isdir(c["uri"])
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(c["uri"]) for f in fs)
        assert c["bytes"] == size > 0
        assert 0 < c["duration_s"] < 60


def test_every_rank_of_a_ddp_trainer_sends_every_field(shared_server, shared_http, tmp_path):
    _train(shared_server.url, "hf-ddp", tmp_path)

    cols = shared_http.get("/v1/runs/hf-ddp/metrics").json()["columns"]
    by = {(s, r): i for i, (s, r) in enumerate(zip(cols["step"], cols["rank"]))}
    assert sorted(by) == [(s, r) for s in range(1, 7) for r in (0, 1)]

    def val(field, step, rank):
        return cols[field][by[(step, rank)]]

    for step in range(1, 7):
        assert val("loss", step, 0) != val("loss", step, 1)                  # each rank's own batch
        l0, l1 = val("local_grad_norm", step, 0), val("local_grad_norm", step, 1)
        g0, g1 = val("grad_norm", step, 0), val("grad_norm", step, 1)
        assert l0 > 0 and l1 > 0 and l0 != l1                                # before the all-reduce
        assert g0 == pytest.approx(g1, rel=1e-6) and g0 <= (l0 + l1) / 2 * (1 + 1e-6)
        # The lr the step's update used (the linear schedule's, from 1e-3 to 0 over 6 steps).
        assert val("lr", step, 0) == val("lr", step, 1) == pytest.approx(1e-3 * (7 - step) / 6)
        for rank in (0, 1):
            assert val("data_cursor", step, rank) == 4 * step                # 4 samples a step
            assert val("step_time", step, rank) >= val("compute_time", step, rank) > 0
            assert val("data_time", step, rank) >= 0
    # Fingerprints every 2 steps, the same on both replicas.
    assert [s for s in range(1, 7) if val("param_digest", s, 0) is not None] == [2, 4, 6]
    assert all(val("param_digest", s, 0) == val("param_digest", s, 1) for s in (2, 4, 6))
    assert [c["step"] for c in shared_http.get("/v1/runs/hf-ddp/checkpoints").json()] == [2, 4, 6]


@pytest.mark.timeout(600)  # three trainings
def test_a_resume_that_ignores_the_data_skip_raises_resume_mismatch(shared_server, shared_http, tmp_path):
    """By default the Trainer skips the batches already trained on when it resumes mid-epoch (the
    data continues: nothing raised); with ``ignore_data_skip`` it starts the epoch's data again,
    and the service says so at the first step after the resume."""
    run_id, out = "hf-resume", tmp_path / "out"
    _train(shared_server.url, run_id, tmp_path)                                        # steps 1..6
    _train(shared_server.url, run_id, tmp_path, "--resume", str(out / "checkpoint-4"))  # 5, 6
    shared_http.drain()
    assert shared_http.get(f"/v1/runs/{run_id}").json()["attempt"] == 2
    assert shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "resume_mismatch"}).json() == []

    _train(shared_server.url, run_id, tmp_path, "--resume", str(out / "checkpoint-2"), "--ignore-data-skip")
    shared_http.drain()
    found = shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "resume_mismatch"}).json()
    assert [(f["metric"], f["step"], f["evidence"]["expected"], f["evidence"]["got"]) for f in found] == [
        ("data_cursor", 3, 12, 4)]


def _train(url, run_id, tmp_path, *extra):
    torchrun(Path(__file__).with_name("hf_ddp_train.py"), "--url", url, "--run-id", run_id,
             "--out", str(tmp_path / "out"), *extra, cwd=tmp_path)
