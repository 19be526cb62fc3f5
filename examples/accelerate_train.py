"""healthsvc in a training loop written with Hugging Face ``accelerate``: no integration needed.

    torchrun --nproc_per_node 2 examples/accelerate_train.py --url http://127.0.0.1:8080 --run-id acc-1
    # or: accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py --url ... --run-id ...
    # (--multi_gpu is accelerate's torchrun launcher; this script asks for the CPU, so gloo. With
    # --cpu, accelerate launch starts one process only.)
    # resume: ... --resume accelerate-ckpt/step3

``accelerate`` runs the same script on every process; each one reports its own values (not through
``accelerator.log``, which runs on the main process only and so cannot see a bad rank):

- ``healthsvc_client.init`` with ``rank=accelerator.process_index`` and ``world_size=accelerator.num_processes``;
- ``loss``: this process's loss on its own batch, before any gather (``accelerator.gather`` would
  average a NaN away);
- ``local_grad_norm``: this process's gradient norm *before* the all-reduce, from a DDP
  communication hook (``healthsvc_client.grad_hooks.LocalGradNorm``; ``accelerator.prepare`` returns the
  DDP-wrapped model when there are several processes); it names the process a NaN came from;
- ``grad_norm``: what ``accelerator.clip_grad_norm_`` returns (after the all-reduce, the same on
  every process);
- ``step_time``, ``data_time``, ``compute_time`` from ``healthsvc_client.StepTimer`` (``compute_time``
  includes the all-reduce, which DDP overlaps with ``backward``);
- ``lr``: the learning rate the step's update used (read before the scheduler steps);
- ``data_cursor``: the samples this process's loader has yielded since the run began, counted from
  the data: after a resume, the batches ``accelerator.skip_first_batches`` skipped plus those the
  loop took since. A resume that does not skip (``--reset-sampler``, a fault to try it) starts
  the epoch's data again, the cursor goes back, and the service raises ``resume_mismatch``;
- ``param_digest`` every ``--fingerprint-every`` steps (``healthsvc_client.digest.due``), in the step's own
  record: the replicas must hold the same bits;
- a checkpoint from the main process, with the time ``accelerator.save_state`` took; the step is
  saved with the model, the optimizer, the scheduler and the RNG state, so a resume continues.

A tiny linear model on random data keeps it to a few seconds on a CPU.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from accelerate import Accelerator

import healthsvc_client as health
from healthsvc_client.digest import due
from healthsvc_client.grad_hooks import LocalGradNorm


class Progress:
    """The step a checkpoint was saved after; ``accelerator.save_state`` saves it with the rest."""

    def __init__(self) -> None:
        self.step = -1

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="healthsvc base URL")
    p.add_argument("--run-id", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--ckpt-every", type=int, default=4)
    p.add_argument("--ckpt-dir", default="accelerate-ckpt")
    p.add_argument("--fingerprint-every", type=int, default=4)
    p.add_argument("--resume", default=None, help="a checkpoint directory this script saved")
    p.add_argument("--reset-sampler", action="store_true",
                   help="fault: on --resume, start the epoch's data again instead of skipping")
    args = p.parse_args()

    accelerator = Accelerator(cpu=True)
    run = health.init(args.url, run_id=args.run_id, rank=accelerator.process_index,
                      world_size=accelerator.num_processes)
    torch.manual_seed(0)  # the same model on every process; the loader gives each its own batches
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # Linear decay to a tenth over the run. Not passed to prepare: accelerate would step a prepared
    # scheduler once per process per step.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - 0.9 * s / args.steps)
    data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    batch_size = 16                       # per process
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(scheduler, progress)
    local = LocalGradNorm.attach(model)   # None in a one-process run: no all-reduce to look before

    if args.resume:
        accelerator.load_state(args.resume)
    start = progress.step + 1
    per_epoch = len(loader)               # batches per process and epoch
    timer = health.StepTimer(run=run)
    step = start
    while step < args.steps:
        epoch, skipped = divmod(step, per_epoch)   # skipped > 0 only when resuming mid-epoch
        if args.reset_sampler:
            skipped = 0
        epoch_loader = accelerator.skip_first_batches(loader, skipped) if skipped else loader
        epoch_loader.set_epoch(epoch)              # each epoch's own shuffle, the same on a resume
        batches = iter(epoch_loader)
        for taken in range(skipped + 1, per_epoch + 1):
            if step >= args.steps:
                break
            timer.start_step(step)
            with timer.data():
                x, y = next(batches)
            with timer.compute():
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)                     # DDP all-reduces here
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1e9)
                lr = scheduler.get_last_lr()[0]                # the lr this update uses
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            record = {"loss": loss.detach(), "grad_norm": grad_norm, "lr": lr,
                      "data_cursor": (epoch * per_epoch + taken) * batch_size, **timer.end_step()}
            if local is not None:
                record["local_grad_norm"] = local.take()
            if due(step, args.fingerprint_every):
                record.update(run.fingerprint_fields(accelerator.unwrap_model(model)))
            health.log(record, step=step)
            if (step + 1) % args.ckpt_every == 0:
                progress.step = step
                begin = time.perf_counter()
                path = os.path.abspath(os.path.join(args.ckpt_dir, f"step{step}"))
                with health.phase("checkpoint", step=step):
                    accelerator.save_state(path)               # every process takes part
                if accelerator.is_main_process:
                    health.checkpoint(step, path, duration_s=time.perf_counter() - begin)
            step += 1
    health.finish()


if __name__ == "__main__":
    main()
