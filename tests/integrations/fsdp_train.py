"""A tiny FSDP2 training (``fully_shard``, gloo, CPU) for tests/integrations, and the recipe of
docs/client.md "FSDP and DeepSpeed": what to send when the model is sharded. Run it under torchrun
with 2 processes; each holds half of every parameter.

- ``grad_norm``: ``clip_grad_norm_`` over the sharded (``DTensor``) gradients is the global norm
  (each shard's norm, all-reduced); ``full_tensor()`` gives it as a plain tensor. Timed as comm.
- no ``local_grad_norm``: FSDP reduce-scatters inside backward; there is no DDP bucket to hook,
  and a shard's norm is not "this rank's gradient".
- ``param_digest`` of this rank's shards with ``replica_group=rank``: no other rank holds the same
  bits under full sharding (with hybrid sharding, the ranks holding the same shard share a group).
- checkpoints with ``torch.distributed.checkpoint`` (every rank writes its shards).
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard

import healthsvc_client as health
from healthsvc_client.digest import due
from tests.integrations.torchrun import job_parser


def main() -> None:
    p = job_parser()
    p.add_argument("--ckpt-dir", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    run = health.init(args.url, run_id=args.run_id, rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - 0.5 * s / args.steps)
    data = torch.utils.data.TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
    batch_size = 4
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size,
                                         sampler=torch.utils.data.DistributedSampler(data, shuffle=False))
    batches = iter(loader)
    timer = health.StepTimer(run=run)
    for step in range(args.steps):
        timer.start_step(step)
        with timer.data():
            x, y = next(batches)
        with timer.compute():
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()                          # FSDP reduce-scatters the gradients here
        with timer.comm():
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).full_tensor()
        with timer.compute():
            lr = scheduler.get_last_lr()[0]          # the lr this update uses
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        record = {"loss": loss.detach(), "grad_norm": grad_norm, "lr": lr,
                  "data_cursor": (step + 1) * batch_size, **timer.end_step()}
        if due(step, 2):
            record.update(run.fingerprint_fields(model, replica_group=rank))
        health.log(record, step=step)
        if (step + 1) % 3 == 0:
            path = os.path.abspath(os.path.join(args.ckpt_dir, f"step{step}"))
            begin = time.perf_counter()
            dcp.save({"model": model.state_dict()}, checkpoint_id=path)
            if rank == 0:
                health.checkpoint(step, path, duration_s=time.perf_counter() - begin)
    health.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
