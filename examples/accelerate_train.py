"""healthsvc in a training loop written with Hugging Face ``accelerate``: no integration needed.

    torchrun --nproc_per_node 2 examples/accelerate_train.py --url http://127.0.0.1:8080 --run-id acc-1
    # or: accelerate launch --num_processes 2 --cpu examples/accelerate_train.py --url ... --run-id ...

``accelerate`` runs the same script on every process; each one reports its own values:

- ``clients.init`` with ``rank=accelerator.process_index`` and ``world_size=accelerator.num_processes``;
- ``loss``: this process's loss on its own batch, before any gather (``accelerator.gather`` would
  average a NaN away);
- ``local_grad_norm``: this process's gradient norm *before* the all-reduce, from a DDP
  communication hook (``clients.grad_hooks.LocalGradNorm``; ``accelerator.prepare`` returns the
  DDP-wrapped model when there are several processes); it names the process a NaN came from;
- ``grad_norm``: what ``accelerator.clip_grad_norm_`` returns (after the all-reduce, the same on
  every process);
- a checkpoint from the main process, with the time ``accelerator.save_state`` took.

A tiny linear model on random data keeps it to a few seconds on a CPU.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from accelerate import Accelerator

import clients as health
from clients.grad_hooks import LocalGradNorm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="healthsvc base URL")
    p.add_argument("--run-id", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--ckpt-every", type=int, default=4)
    p.add_argument("--ckpt-dir", default="accelerate-ckpt")
    args = p.parse_args()

    accelerator = Accelerator(cpu=True)
    health.init(args.url, run_id=args.run_id, rank=accelerator.process_index,
                world_size=accelerator.num_processes)
    torch.manual_seed(0)  # the same model on every process; the data differs per process below
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    local = LocalGradNorm.attach(model)   # None in a one-process run: no all-reduce to look before
    gen = torch.Generator().manual_seed(1000 + accelerator.process_index)

    for step in range(args.steps):
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
        with health.phase("compute", step=step):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)                         # DDP all-reduces here
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1e9)
        optimizer.step()
        optimizer.zero_grad()
        record = {"loss": loss.detach(), "grad_norm": grad_norm}
        if local is not None:
            record["local_grad_norm"] = local.take()
        health.log(record, step=step)
        if (step + 1) % args.ckpt_every == 0:
            start = time.perf_counter()
            path = os.path.abspath(os.path.join(args.ckpt_dir, f"step{step}"))
            with health.phase("checkpoint", step=step):
                accelerator.save_state(path)                   # every process takes part
            if accelerator.is_main_process:
                health.checkpoint(step, path, duration_s=time.perf_counter() - start)
    health.finish()


if __name__ == "__main__":
    main()
