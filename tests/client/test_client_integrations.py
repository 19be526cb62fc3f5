"""Lightning and Hugging Face callbacks, each training a tiny model on the CPU, offline (mock service).

Each asserts that the per-rank per-step loss the callback reports is exactly the loss the model
computed at that step, NaN included (both frameworks would average or filter it away).
"""
from __future__ import annotations

import math

import pytest

from healthsvc_client.client import Run
from healthsvc_client.transport import MockTransport


def make_run(service) -> Run:
    return Run("http://fake", "tiny", 0, transport=MockTransport(service), flush_interval_s=0.02,
               heartbeat_interval_s=0)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6)


def test_lightning_callback_reports_each_steps_own_loss_and_grad_norm(service):
    torch = pytest.importorskip("torch")   # in the tests: every worker collects this module
    L = pytest.importorskip("lightning")
    from healthsvc_client.lightning import HealthCallback

    torch.manual_seed(0)
    computed: list[float] = []

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            if self.global_step == 3:
                loss = loss * float("nan")  # the step a fault would hit
            computed.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 1))
    run = make_run(service)
    callback = HealthCallback(run=run)
    trainer = L.Trainer(max_steps=5, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback])
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    assert run.finish(5.0)

    records = service.records()
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert all(same(r["loss"], c) for r, c in zip(records, computed))
    assert math.isnan(records[3]["loss"]) and math.isfinite(records[2]["loss"])
    assert all(r["grad_norm"] > 0 for r in records[:3]) and math.isnan(records[3]["grad_norm"])
    # One process: no all-reduce, so this rank's local norm is the global one.
    assert all(same(r["local_grad_norm"], r["grad_norm"]) for r in records)
    assert all(r["lr"] == 0.1 and r["step_time"] >= r["compute_time"] >= 0 for r in records)


def test_lightning_callback_creates_a_run_per_rank_with_trainer_rank(service, monkeypatch):
    L = pytest.importorskip("lightning")
    from healthsvc_client.lightning import HealthCallback

    callback = HealthCallback("http://fake", "exp", transport=MockTransport(service),
                              heartbeat_interval_s=0)

    class FakeTrainer:
        global_rank, world_size = 5, 8

    callback.setup(FakeTrainer(), None, "fit")
    assert (callback.run.rank, callback.run.world_size, callback.run.run_id) == (5, 8, "exp")
    assert isinstance(callback, L.pytorch.callbacks.Callback)
    callback.run.finish(1.0)


def test_hf_trainer_reports_per_rank_per_step_loss_including_nan(service, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    from healthsvc_client.hf import attach

    torch.manual_seed(0)
    computed: list[float] = []

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.calls = 0

        def forward(self, x, labels):
            loss = torch.nn.functional.mse_loss(self.layer(x), labels)
            self.calls += 1
            if self.calls == 3:
                loss = loss * float("nan")
            computed.append(loss.item())
            return {"loss": loss}

    dataset = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(16)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=0.05, report_to=[], use_cpu=True, logging_steps=100,
                             save_strategy="steps", save_steps=2, disable_tqdm=True,
                             max_grad_norm=1.0, dataloader_num_workers=0)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=dataset)
    run = make_run(service)
    attach(trainer, run=run)
    trainer.train()
    assert run.finish(5.0)

    records = service.records()
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # state.global_step after each update
    assert all(same(r["loss"], c) for r, c in zip(records, computed))
    assert math.isnan(records[2]["loss"])  # the Trainer's own log would show an average here
    assert records[0]["grad_norm"] > 0 and records[0]["lr"] > 0
    assert all(r["compute_time"] > 0 and r["step_time"] >= r["compute_time"] for r in records)
    checkpoints = service.bodies("checkpoints")
    assert [(c["step"], c["uri"].rsplit("/", 1)[-1]) for c in checkpoints] == [
        (2, "checkpoint-2"), (4, "checkpoint-4")]
