"""The Hugging Face callback on a real ``transformers.Trainer`` training a tiny randomly
initialised GPT-2 (no download) against a real server: per-step records, and checkpoints
registered with the time the save took and their size."""
from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.timeout(300)]


def test_trainer_checkpoints_are_registered_with_durations(shared_server, shared_http, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from clients.hf import attach

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
