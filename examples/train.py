"""A tiny character-level transformer trained data-parallel with torch.distributed (gloo, CPU),
reporting every rank's health to healthsvc, with faults injected by flag.

It reads top to bottom like nanoGPT's train.py: config, model, data, the loop, checkpoints.

    # 4 ranks, 300 steps, reporting to a local service (a few seconds on 2 cores)
    python examples/train.py --url http://127.0.0.1:8000 --run-id demo --steps 300

    # one rank's loss turns NaN at step 120
    python examples/train.py ... --fault nan --fault-rank 2 --fault-step 120
    # ... once, as a hardware error would: a resumed run (--resume) trains clean
    python examples/train.py ... --fault nan --fault-rank 2 --fault-step 120 --fault-transient
    # the loss spikes at step 150 (on every rank with --fault-rank -1)
    python examples/train.py ... --fault loss_spike --fault-rank -1 --fault-step 150
    # rank 1 straggles from step 50 on: 1.3x (mild) or 3x (strong) its compute time
    python examples/train.py ... --fault straggler --fault-rank 1 --fault-step 50 --slow-factor 3
    # rank 3 hangs 20 s at step 100, outside the collective (its peers wait inside it)
    python examples/train.py ... --fault hang --fault-rank 3 --fault-step 100 --hang-s 20 --hang-where outside
    # rank 2's gradients are corrupted (scaled and noised before the all-reduce) from step 140 on
    python examples/train.py ... --fault corrupt_grad --fault-rank 2 --fault-step 140
    # ... or only noised: noise as large as the gradient on a quarter of its elements
    python examples/train.py ... --fault grad_noise --fault-rank 2 --fault-step 140 --noise-frac 0.25
    # the learning rate x8 for 20 steps from step 150 (every rank: it is the job's schedule)
    python examples/train.py ... --fault lr_spike --fault-rank -1 --fault-step 150 --lr-factor 8 --fault-steps 20
    # a loaded machine: every step's compute takes 1-2x longer on every rank at once
    python examples/train.py ... --jitter 2
    # ... then restart from the checkpoint the service says is clean, without the fault
    python examples/train.py ... --resume-from-rollback
    # rank 3 dies at step 160; the job restarts elastically with 3 ranks from the last checkpoint
    python examples/train.py ... --fault leave --fault-rank 3 --fault-step 160
    # a bit flips in one weight of rank 2's replica after the update of step 120 (silent: only
    # the replica fingerprints, sent every --fingerprint-every steps, see it)
    python examples/train.py ... --fault weight_bitflip --fault-rank 2 --fault-step 120
    # ... or in rank 1's optimizer state (AdamW's second moment); --fingerprint-optimizer makes
    # the fingerprint cover the optimizer state, so it is seen at the next fingerprint
    python examples/train.py ... --fault optim_bitflip --fault-rank 1 --fault-step 120 --fingerprint-optimizer
    # ... or in an MLP output bias of rank 1's replica (--flip-bit 25: an exponent bit, x16)
    python examples/train.py ... --fault bias_bitflip --fault-rank 1 --fault-step 120 --flip-bit 25 --flip-index 35
    # a bigger model on a larger text, with a warm-up (any text file: here the project's docs)
    python examples/train.py ... --n-layer 3 --n-embd 64 --text docs/quality.md --warmup-steps 100
    # resume from a checkpoint with the data sampler restarted from the beginning of the stream,
    # and/or the learning-rate schedule restarted (faults can be combined with commas)
    python examples/train.py ... --resume ckpt.pt --lr-schedule cosine --fault resume_sampler_reset,resume_scheduler_reset
    # four "hosts" on one machine; --exclude leaves node2 out (3 ranks): what healthsvc supervise
    # passes after the fingerprints blame node2 (docs/supervise.md)
    python examples/train.py ... --hosts node0,node1,node2,node3 --exclude node2 --resume ckpt.pt
    # answer the service's replay probes (POST /v1/runs/{run}/probes), polled every 10 steps
    python examples/train.py ... --probe-every 10

With --aggregate, rank 0 gathers every rank's record and sends one columnar batch per step (the
rank-0 aggregator mode). With no --url (and no HEALTHSVC_URL) the client is disabled; --spool DIR writes each rank's records
to DIR/rank{r}.jsonl instead (upload later with healthsvc_client.sync.upload_spool).

Checkpoints are plain dicts (model, optimizer, step, config, world size) saved by rank 0 every
--ckpt-every steps; the checkpoint of step s holds the state after the update of step s, so a run
resumed from it continues at step s + 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install needed
import healthsvc_client  # noqa: E402
from healthsvc_client.digest import FINGERPRINT_EVERY, due  # noqa: E402
from healthsvc_client.probe import next_probe, report_probe  # noqa: E402
from healthsvc_client.timing import StepTimer  # noqa: E402

FAULTS = ("none", "nan", "loss_spike", "straggler", "hang", "corrupt_grad", "grad_noise", "lr_spike",
          "leave", "weight_bitflip", "optim_bitflip", "bias_bitflip", "resume_sampler_reset",
          "resume_scheduler_reset")

# A small corpus that ships with the example: no download, the same on every machine.
TEXT = """\
A training run is a long conversation between the data and the weights. Most of the time it is
quiet: the loss falls, the gradient norm wanders, every rank waits for its peers at the all-reduce
and moves on. Then one night a rank returns a number that is not a number, or a node slows down
because its fan has failed, or a bit flips in a gradient and nobody notices for a thousand steps.
The service listens to every rank at every step. It tells a spike from a trend, a straggler from a
slow job, a hung rank from a finished one, and when something went silently wrong it names the last
checkpoint that is still clean, so the run can go back there and carry on as if nothing happened.
"""


@dataclass
class Config:
    # service
    url: str | None = None
    run_id: str = "example"
    spool: str | None = None
    heartbeat_s: float = 1.0
    # model: about 30k parameters, a few ms per step on one CPU core
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    block_size: int = 32
    # training
    world_size: int = 4
    # hosts, one per rank (comma-separated; empty: this machine's name), so one machine can play a
    # cluster; --exclude leaves some out: their ranks are not started and the world size shrinks.
    # A fault's --fault-rank then names a host (its place in --hosts): the fault follows the machine.
    hosts: str = ""
    exclude: str = ""
    steps: int = 300
    batch_size: int = 8
    text: str = ""                  # a text file to train on (empty: the paragraph below)
    lr: float = 3e-3
    lr_schedule: str = "constant"   # or "cosine": decays to lr / 10 over --steps
    warmup_steps: int = 0           # the learning rate rises linearly from 0 over these steps
    max_grad_norm: float = 1.0
    seed: int = 1337
    log_every: int = 50
    # checkpoints
    ckpt_dir: str = "checkpoints"
    ckpt_every: int = 50
    resume: str | None = None
    resume_from_rollback: bool = False
    # replica fingerprints: the digest of the parameters every N steps (0: never)
    fingerprint_every: int = FINGERPRINT_EVERY
    fingerprint_optimizer: bool = False
    # replay probes: rank 0 asks the service for a probe every N steps (0: never)
    probe_every: int = 0
    # faults
    fault: str = "none"
    fault_rank: int = 0
    fault_step: int = 100
    fault_steps: int = 1             # how many steps a windowed fault (lr_spike) lasts
    # the fault strikes the first attempt only: a resumed run trains clean, as after a transient
    # hardware error (without it a fault is in the data, and comes back at its step)
    fault_transient: bool = False
    slow_factor: float = 1.3
    spike_factor: float = 4.0
    hang_s: float = 20.0
    hang_where: str = "outside"
    corrupt_scale: float = 8.0
    noise_frac: float = 0.25         # grad_noise: the share of gradient elements noised
    lr_factor: float = 8.0           # lr_spike: the learning rate's factor
    flip_bit: int = 22               # the top mantissa bit of a float32: the value moves by up to 2x
    flip_index: int = 7              # which element of the tensor flips
    # weight_bitflip: which parameter (its name in model.named_parameters()); the output head by
    # default, e.g. "ln_f.weight" (the final layer norm's gain: every token's logits go through it)
    flip_param: str = "head.weight"
    # the machine: each step's compute takes 1 to --jitter times longer on every rank at once
    jitter: float = 1.0
    # reporting: rank 0 gathers all ranks' records and sends them as one columnar batch per step
    aggregate: bool = False
    # internal: set by the launcher on an elastic restart
    restart_reason: str | None = None
    port: int = 0


def placement(cfg: Config) -> list[tuple[int, str | None]]:
    """(slot, host) of each rank: rank r runs on the r-th host --exclude left in. The slot (the
    host's place in --hosts) is what a fault's --fault-rank names."""
    if not cfg.hosts:
        return [(r, None) for r in range(cfg.world_size)]
    out = set(filter(None, cfg.exclude.split(",")))
    return [(i, h) for i, h in enumerate(cfg.hosts.split(",")) if h not in out]


# ---- model: GPT in miniature -------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, cfg: Config, vocab_size: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


# ---- data ------------------------------------------------------------------------------------------

def encode_corpus(cfg: Config | None = None) -> tuple[torch.Tensor, int]:
    # The built-in paragraph unless --text names a larger corpus (the recorder's bigger model).
    text = Path(cfg.text).read_text(encoding="utf-8") if cfg is not None and cfg.text else TEXT
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), len(chars)


def get_batch(data: torch.Tensor, cfg: Config, index: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    # The index-th batch of this rank's stream, seeded by (seed, index, rank): a run resumed at the
    # right data position (index = samples consumed / batch size) sees exactly the same batches.
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + index * 1_009 + rank)
    ix = torch.randint(len(data) - cfg.block_size - 1, (cfg.batch_size,), generator=g)
    x = torch.stack([data[i:i + cfg.block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + cfg.block_size] for i in ix])
    return x, y


# ---- faults ----------------------------------------------------------------------------------------

@dataclass
class Faults:
    """What the flags inject, on which rank (-1: every rank), from which step."""

    cfg: Config
    rank: int

    def active(self, kind: str) -> bool:
        return kind in self.cfg.fault.split(",")

    def hits(self, kind: str, step: int, persistent: bool = False) -> bool:
        c = self.cfg
        if c.fault_transient and (c.resume or c.resume_from_rollback):
            return False
        on_rank = c.fault_rank in (-1, self.rank)
        at_step = step >= c.fault_step if persistent else c.fault_step <= step < c.fault_step + c.fault_steps
        return self.active(kind) and on_rank and at_step

    def loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        if self.hits("nan", step):
            return loss * float("nan")
        if self.hits("loss_spike", step):
            return loss * self.cfg.spike_factor
        return loss

    def lr_factor(self, step: int) -> float:
        return self.cfg.lr_factor if self.hits("lr_spike", step) else 1.0

    def load(self, step: int, compute_s: float) -> None:
        # A loaded machine, not a fault: the same factor on every rank at a step (seeded by the
        # step), log-uniform in [1, jitter], so the job's step time jitters while no rank is slower
        # than its peers.
        if self.cfg.jitter > 1.0:
            u = torch.rand(1, generator=torch.Generator().manual_seed(self.cfg.seed * 7_919 + step)).item()
            time.sleep((self.cfg.jitter ** u - 1.0) * compute_s)

    def straggle(self, step: int, compute_s: float) -> None:
        if self.hits("straggler", step, persistent=True):
            time.sleep((self.cfg.slow_factor - 1.0) * compute_s)

    def hang(self, step: int, where: str) -> None:
        if self.hits("hang", step) and self.cfg.hang_where == where:
            time.sleep(self.cfg.hang_s)

    def corrupt(self, step: int, flat_grad: torch.Tensor) -> torch.Tensor:
        # Silent corruption: this rank's gradient is wrong before it is averaged in, every step.
        if self.hits("corrupt_grad", step, persistent=True):
            g = torch.Generator().manual_seed(step)
            noise = torch.randn(flat_grad.shape, generator=g) * flat_grad.std()
            return flat_grad * self.cfg.corrupt_scale + noise * self.cfg.corrupt_scale
        if self.hits("grad_noise", step, persistent=True):
            # Noise as large as the gradient itself (its RMS) on a fixed share of its elements.
            mask = torch.rand(flat_grad.shape, generator=torch.Generator().manual_seed(self.cfg.seed))
            noise = torch.randn(flat_grad.shape, generator=torch.Generator().manual_seed(step))
            rms = flat_grad.norm() / math.sqrt(flat_grad.numel())
            return flat_grad + (mask < self.cfg.noise_frac) * noise * rms
        return flat_grad

    def leaves(self, step: int) -> bool:
        return self.hits("leave", step)

    def flip_bits(self, step: int, model: CharGPT, opt: torch.optim.Optimizer) -> None:
        # A flipped bit in this replica's memory after the update: no error, no NaN, and the
        # replicas are no longer identical (the all-reduce keeps their gradients equal, not them).
        # The output head's weights: every forward pass uses them (a flipped embedding row would
        # matter only to batches that hold its character).
        head = model.head.weight
        if self.hits("weight_bitflip", step):
            _flip(dict(model.named_parameters())[self.cfg.flip_param].data, self.cfg.flip_index, self.cfg.flip_bit)
        if self.hits("optim_bitflip", step):
            _flip(opt.state[head]["exp_avg_sq"], self.cfg.flip_index, self.cfg.flip_bit)
        if self.hits("bias_bitflip", step):  # the first MLP's output bias: one residual channel shifts
            _flip(model.blocks[0].mlp[2].bias.data, self.cfg.flip_index, self.cfg.flip_bit)


def _flip(t: torch.Tensor, index: int, bit: int) -> None:
    t.view(-1).view(torch.int32)[index] ^= 1 << bit


# ---- rank-0 aggregator mode -------------------------------------------------------------------------

def gather_and_log(run: healthsvc_client.Run, record: dict[str, float], step: int, rank: int, world_size: int) -> None:
    """Gather every rank's record on rank 0, which sends one columnar batch per step.

    One small extra collective per step instead of one HTTP client per rank pushing: for jobs
    where only rank 0 may talk to the network. Every rank still sends its own heartbeat.
    """
    names = sorted(record)
    mine = torch.tensor([float(record[n]) for n in names], dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(world_size)] if rank == 0 else None
    dist.gather(mine, gathered, dst=0)
    if rank == 0:
        table = torch.stack(gathered)  # (world_size, fields); NaN stays NaN
        columns = {n: table[:, i].tolist() for i, n in enumerate(names)}
        run.log_columns({"rank": list(range(world_size)), **columns}, step=step)


# ---- checkpoints -----------------------------------------------------------------------------------

def lr_schedule(cfg: Config, opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        if cfg.lr_schedule == "cosine":  # from lr down to lr / 10 over the run
            return warm * (0.1 + 0.45 * (1 + math.cos(math.pi * min(step, cfg.steps) / cfg.steps)))
        return warm
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def save_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer,
                    sched: torch.optim.lr_scheduler.LRScheduler, step: int, data_cursor: int,
                    cfg: Config, world_size: int) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "step": step, "data_cursor": data_cursor,
                "config": dataclasses.asdict(cfg), "world_size": world_size}, tmp)
    os.replace(tmp, path)  # a crash mid-save never leaves a half checkpoint under the real name
    return path.stat().st_size


def latest_checkpoint(ckpt_dir: str) -> Path | None:
    found = sorted(Path(ckpt_dir).glob("ckpt_*.pt"))
    return found[-1] if found else None


def uri_to_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


# ---- one rank --------------------------------------------------------------------------------------

def train(rank: int, world_size: int, cfg: Config) -> None:
    torch.set_num_threads(1)  # 4 ranks share 2 cores: intra-op threads would only fight
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            init_method=f"tcp://127.0.0.1:{cfg.port}",
                            timeout=datetime.timedelta(seconds=max(120.0, 3 * cfg.hang_s)))
    slot, host = placement(cfg)[rank] if cfg.hosts else (rank, None)
    if cfg.url:
        run = healthsvc_client.init(cfg.url, cfg.run_id, rank, world_size=world_size, host=host,
                           heartbeat_interval_s=cfg.heartbeat_s)
    elif cfg.spool:
        run = healthsvc_client.init(run_id=cfg.run_id, rank=rank, world_size=world_size, mode="offline",
                           spool_path=os.path.join(cfg.spool, f"rank{rank}.jsonl"))
    else:
        run = healthsvc_client.init(run_id=cfg.run_id, rank=rank, world_size=world_size, mode="disabled")

    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    data, vocab_size = encode_corpus(cfg)
    model = CharGPT(cfg, vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    sched = lr_schedule(cfg, opt)
    faults = Faults(cfg, slot)

    # Where to start: a given checkpoint, the service's rollback target, or the newest local one
    # after an elastic restart. Rank 0 decides and tells the others.
    resume = [uri_to_path(cfg.resume) if cfg.resume else None]   # a path or a file:// URI
    if rank == 0 and cfg.resume_from_rollback:
        target = run.rollback_target()
        checkpoint = (target or {}).get("checkpoint")
        resume = [uri_to_path(checkpoint["uri"]) if checkpoint else None]
        print(f"rollback target: {json.dumps(target)}", flush=True)
    elif rank == 0 and cfg.restart_reason is not None:
        latest = latest_checkpoint(cfg.ckpt_dir)
        resume = [str(latest) if latest else None]
    dist.broadcast_object_list(resume, src=0)
    start_step, data_cursor = 0, 0
    if resume[0]:
        state = torch.load(resume[0], weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_step = state["step"] + 1
        # The data position and the schedule continue where the checkpoint left off (unless a
        # fault restarts them: the subtle corruptions of a resume that raise no error).
        if not faults.active("resume_sampler_reset"):
            data_cursor = state.get("data_cursor", start_step * cfg.batch_size)
        if faults.active("resume_scheduler_reset"):
            # The common slip: the scheduler made again after the optimizer was restored, not
            # restored itself: it starts the schedule again from its first step.
            sched = lr_schedule(cfg, opt)
        elif "scheduler" in state:
            sched.load_state_dict(state["scheduler"])
        if rank == 0:
            if cfg.resume_from_rollback:
                run.event("rollback", step=state["step"], uri=resume[0])
            if cfg.restart_reason is not None:
                run.event("restart", step=state["step"], reason=cfg.restart_reason)
            # A launcher that left hosts out (--exclude: healthsvc supervise) records the change.
            if state["world_size"] != world_size and not cfg.exclude:
                run.event("world_size_change", step=start_step, old=state["world_size"], new=world_size)

    try:
        loop(rank, world_size, cfg, run, model, opt, sched, data, start_step, data_cursor, faults)
    except RuntimeError as exc:  # a peer died: the collective failed; leave like a crashed rank
        run.flush(timeout_s=2.0)
        print(f"rank {rank}: {str(exc).splitlines()[0][:200]}", file=sys.stderr, flush=True)
        sys.exit(1)
    dist.destroy_process_group()


def local_gradient(model: nn.Module, params: list[torch.Tensor], faults: Faults, x: torch.Tensor,
                   y: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's loss and flat gradient on (x, y), before the all-reduce."""
    loss = faults.loss(step, model(x, y))
    for p in params:
        p.grad = None if p.grad is None else p.grad.zero_()
    loss.backward()
    return loss, faults.corrupt(step, torch.cat([p.grad.view(-1) for p in params]))


def answer_probes(run: healthsvc_client.Run, rank: int, model: nn.Module, params: list[torch.Tensor],
                  faults: Faults, data: torch.Tensor, cfg: Config, step: int) -> None:
    """A replay probe (GET .../probes/next): the suspect and the healthy rank recompute one step's
    gradient norm on the same fixed batch with their own weights and hardware, and report it.
    Equal: the data or the code; different: the suspect's hardware (or its state). Rank 0 asks
    and tells the others (a collective: every rank takes part at the same step)."""
    probe = [next_probe(run, upto_step=step) if rank == 0 else None]
    dist.broadcast_object_list(probe, src=0)
    p = probe[0]
    if p is None or rank not in (p["suspect_rank"], p["healthy_rank"]):
        return
    # The fixed batch: the one the suspect rank trained on at the probe's step.
    x, y = get_batch(data, cfg, p["step"], p["suspect_rank"])
    _, flat = local_gradient(model, params, faults, x, y, step)
    report_probe(run, p["id"], rank, flat.norm().item())


def loop(rank: int, world_size: int, cfg: Config, run: healthsvc_client.Run, model: nn.Module,
         opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler, data: torch.Tensor,
         start_step: int, data_cursor: int, faults: Faults) -> None:
    params = list(model.parameters())
    run.set_phase("other", step=start_step)  # heartbeats name the resumed step, not 0
    timer = StepTimer(run=run)
    skipped = 0
    loss = torch.tensor(float("nan"))
    t_last = time.perf_counter()
    for step in range(start_step, cfg.steps):
        timer.start_step(step)
        with timer.data():
            x, y = get_batch(data, cfg, data_cursor // cfg.batch_size, rank)
            data_cursor += cfg.batch_size

        with timer.compute():
            t0 = time.perf_counter()
            loss, flat = local_gradient(model, params, faults, x, y, step)
            faults.load(step, time.perf_counter() - t0)
            faults.straggle(step, time.perf_counter() - t0)
            faults.hang(step, "outside")
            local_grad_norm = flat.norm().item()

        if faults.leaves(step):
            print(f"rank {rank} leaves at step {step}", flush=True)
            os._exit(17)  # a node disappears: no finish, no flush, like a real failure

        with timer.comm():
            faults.hang(step, "inside")
            dist.all_reduce(flat)  # one flat buffer: one collective per step
            flat /= world_size

        with timer.compute():
            grad_norm = flat.norm().item()
            lr = opt.param_groups[0]["lr"] * faults.lr_factor(step)  # the rate of this step's update
            for group in opt.param_groups:  # the scheduler sets the next step's rate afresh
                group["lr"] = lr
            if math.isfinite(grad_norm):
                flat *= min(1.0, cfg.max_grad_norm / (grad_norm + 1e-6))  # clip
                offset = 0
                for p in params:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
                opt.step()
            else:
                skipped += 1  # like a loss scaler: a non-finite step is not applied
            sched.step()
            faults.flip_bits(step, model, opt)

        record = {"loss": loss.item(), "grad_norm": grad_norm, "local_grad_norm": local_grad_norm,
                  "lr": lr, "tokens": x.numel(), "data_cursor": data_cursor, **timer.end_step()}
        # The replica's fingerprint after this step's update: the state a checkpoint here holds
        # (about 11 % of a step of this tiny model, so every 20 steps by default; bench/fingerprint.py),
        # in the step's own record (logged apart, it could arrive as a repeated step: a restart).
        if due(step, cfg.fingerprint_every) and not cfg.aggregate:
            record.update(run.fingerprint_fields(model, optimizer=opt if cfg.fingerprint_optimizer else None))
        if cfg.aggregate:
            gather_and_log(run, record, step, rank, world_size)
        else:
            run.log(record, step=step)
        if cfg.probe_every and (step + 1) % cfg.probe_every == 0:
            answer_probes(run, rank, model, params, faults, data, cfg, step)

        if rank == 0 and cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0:
            with run.phase("checkpoint"):
                t0 = time.perf_counter()
                path = Path(cfg.ckpt_dir) / f"ckpt_{step:06d}.pt"
                size = save_checkpoint(path, model, opt, sched, step, data_cursor, cfg, world_size)
                run.checkpoint(step, f"file://{path.resolve()}", duration_s=time.perf_counter() - t0,
                               bytes=size)
        if rank == 0 and cfg.log_every and (step + 1) % cfg.log_every == 0:
            now = time.perf_counter()
            print(f"step {step + 1:5d} | loss {loss.item():.4f} | grad_norm {grad_norm:.3f} | "
                  f"{1000 * (now - t_last) / cfg.log_every:.1f} ms/step", flush=True)
            t_last = now

    delivered = run.finish(timeout_s=10.0)
    if rank == 0:
        print(json.dumps({"done": True, "steps": cfg.steps, "start_step": start_step,
                          "final_loss": loss.item() if cfg.steps > start_step else None,
                          "skipped_updates": skipped, "delivered": delivered,
                          "client": run.stats().as_dict()}), flush=True)


# ---- launcher --------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg: Config, world_size: int) -> list[int]:
    """Start ``world_size`` ranks (fork: torch is already imported, so start-up is fast) and wait.

    Returns the exit codes. When a rank dies, its peers fail in the next collective (gloo sees the
    closed connection) or are stopped after a grace period, as an elastic agent would.
    """
    cfg = dataclasses.replace(cfg, port=free_port())
    # The optimizer's constructor imports torch._dynamo on first use (about 1.2 CPU-seconds):
    # imported here, the forked ranks inherit it instead of each importing it again.
    import torch._dynamo  # noqa: F401
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=train, args=(r, world_size, cfg), daemon=False) for r in range(world_size)]
    for p in procs:
        p.start()
    first_failure: float | None = None
    while any(p.is_alive() for p in procs):
        time.sleep(0.05)
        if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
            first_failure = time.monotonic()
        if first_failure is not None and time.monotonic() - first_failure > 10.0:
            for p in procs:
                if p.is_alive():
                    p.kill()
    for p in procs:
        p.join()
    return [p.exitcode for p in procs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(Config):
        if field.name in ("restart_reason", "port"):
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.type in ("bool", bool):
            parser.add_argument(flag, action="store_true")
        else:
            kind = {"int": int, "float": float}.get(str(field.type), str)
            parser.add_argument(flag, type=kind, default=field.default)
    args = parser.parse_args(argv)
    cfg = Config(**vars(args))
    cfg.url = cfg.url or os.environ.get("HEALTHSVC_URL")
    if any(kind not in FAULTS for kind in cfg.fault.split(",")):
        parser.error(f"--fault must be one or several (comma-separated) of {FAULTS}")
    if cfg.lr_schedule not in ("constant", "cosine"):
        parser.error("--lr-schedule must be constant or cosine")
    if cfg.hang_where not in ("inside", "outside"):
        parser.error("--hang-where must be inside or outside")

    if cfg.exclude and not cfg.hosts:
        parser.error("--exclude needs --hosts (the hosts it leaves out are named there)")
    world_size = len(placement(cfg))
    if world_size == 0:
        parser.error("--exclude leaves no host of --hosts")

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        cfg.port = int(os.environ.get("MASTER_PORT", "29500"))
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), cfg)
        return 0

    codes = launch(cfg, world_size)
    if "leave" in cfg.fault.split(",") and any(codes):
        # Elastic restart: the survivors start again without the rank that left, from the newest
        # checkpoint, and the fault does not recur.
        survivors = world_size - 1
        print(f"exit codes {codes}: restarting with {survivors} ranks", flush=True)
        # Not from the rollback target again: that was this launch's starting point, not a new
        # rollback (asking again would post a second, spurious rollback event).
        restarted = dataclasses.replace(cfg, fault="none", resume=None, resume_from_rollback=False,
                                        restart_reason=f"rank {cfg.fault_rank} left")
        codes = launch(restarted, survivors)
    return 0 if not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
