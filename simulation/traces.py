"""Seeded synthetic training traces with fault injection, for tests, benchmarks and notebooks.

Pure numpy. One call builds a whole run as a :class:`~healthsvc_detectors.frame.StepBlock` (steps x ranks)
plus the ground truth of what was injected::

    >>> from simulation import simulate_run, NonFinite, iter_blocks
    >>> run = simulate_run(n_steps=2_000, n_ranks=64, seed=0, faults=[NonFinite(step=1500, rank=7)])
    >>> run.block.values["loss"].shape
    (2000, 64)
    >>> run.truth[0].kind, run.truth[0].step, run.truth[0].ranks
    ('non_finite', 1500, (7,))
    >>> sum(b.n_steps for b in iter_blocks(run.block, sizes=(1, 7, 64)))
    2000

What a clean trace looks like (every number is drawn from the seeded generator):

- ``lr``: linear warm-up over ``warmup_steps`` to ``peak_lr``, then cosine decay to 10 % at
  ``lr_decay_steps`` (a fixed horizon, so a shorter trace is a prefix of a longer one).
- ``loss``: a power law in the cumulative learning rate (so it is flat-ish during warm-up and
  decreases, fast then slowly), times a common per-step factor (AR(1) in log space: some global
  batches are harder) times a per-rank micro-batch factor (log-normal, ``loss_rank_sigma``).
- ``grad_norm``: the global norm after the all-reduce, identical on all ranks: high early, decaying,
  log-normal noise (``grad_sigma``).
- ``local_grad_norm``: each rank's norm before the all-reduce, larger than the global one (averaging
  cancels noise) with per-rank log-normal spread (``local_grad_sigma``).
- times (seconds): ``compute_time`` per rank (a small fixed per-rank hardware offset plus jitter),
  ``data_time`` (small, exponential), ``comm_time`` = the base all-reduce time plus the time this
  rank waited for the slowest one, ``step_time`` = slowest rank's compute + data + base comm,
  identical on all ranks up to 0.1 ms (training is synchronous); now and then a whole-job slow
  step (a GC pause, a checkpoint write).

Faults (each a small frozen dataclass; pass any number in ``faults``):

- :class:`NonFinite` — rank ``rank`` produces a non-finite local value at ``step`` (its
  ``local_grad_norm``, and its ``loss`` too when ``in_loss``); from that step on the global
  ``grad_norm`` is non-finite on every rank, and from ``step + 1`` the weights are poisoned so
  ``loss`` and ``local_grad_norm`` are NaN everywhere.
- :class:`LossSpike` — the loss of ``ranks`` (all when None) is multiplied by ``factor`` for
  ``duration`` steps.
- :class:`GradSpike` — the global and local gradient norms are multiplied by ``factor`` at ``step``;
  the loss peaks ``lead_steps`` later (factor ``loss_factor``), the usual order of events.
- :class:`CorruptRank` — from ``step`` on, rank ``rank`` silently computes wrong gradients: its
  ``local_grad_norm`` is scaled by ``local_grad_scale``, its loss by ``loss_scale``, and the global
  ``grad_norm`` it reports by ``grad_norm_scale`` (1.0 = unaffected).
- :class:`Divergence` — from ``step`` on the loss of every rank drifts up by ``rate`` (log units
  per step) and the gradient norm by ``grad_rate``; no NaN anywhere.
- :class:`Straggler` — from ``step`` on, rank ``rank`` computes ``factor`` times slower; its
  ``comm_time`` shrinks (it waits least) and every rank's ``step_time`` grows.

Ground truth: ``SimulatedRun.truth`` is a list of :class:`Truth` ``(kind, step, ranks, fault)``
where ``kind`` is the finding kind a detector is expected to raise first and ``ranks`` whom it
should blame (empty = run-wide).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from healthsvc_detectors.frame import StepBlock

METRICS: tuple[str, ...] = (
    "loss", "grad_norm", "local_grad_norm", "step_time", "compute_time", "comm_time",
    "data_time", "lr",
)


# --------------------------------------------------------------------------------------- faults
@dataclass(frozen=True)
class NonFinite:
    """Rank ``rank`` goes non-finite at ``step``; the global norm follows everywhere."""
    step: int
    rank: int
    value: float = float("nan")   # nan, inf or -inf
    in_loss: bool = False         # also this rank's loss at ``step`` (forward overflow)
    kind: str = field(default="non_finite", init=False)


@dataclass(frozen=True)
class LossSpike:
    """Loss multiplied by ``factor`` for ``duration`` steps on ``ranks`` (None = all ranks)."""
    step: int
    factor: float = 2.0
    duration: int = 1
    ranks: tuple[int, ...] | None = None
    kind: str = field(default="loss_spike", init=False)


@dataclass(frozen=True)
class GradSpike:
    """Gradient norms times ``factor`` at ``step``; loss peak ``lead_steps`` later."""
    step: int
    factor: float = 8.0
    lead_steps: int = 3
    loss_factor: float = 1.6
    kind: str = field(default="grad_spike", init=False)


@dataclass(frozen=True)
class CorruptRank:
    """Silent corruption on one rank from ``step`` on (scales of 1.0 leave a value untouched)."""
    step: int
    rank: int
    local_grad_scale: float = 3.0
    loss_scale: float = 1.0
    grad_norm_scale: float = 1.0
    kind: str = field(default="corrupt_rank", init=False)


@dataclass(frozen=True)
class Divergence:
    """Slow upward drift of the loss from ``step`` on, ``rate`` log-units per step."""
    step: int
    rate: float = 2e-4
    grad_rate: float = 2e-4
    kind: str = field(default="divergence", init=False)


@dataclass(frozen=True)
class Straggler:
    """Rank ``rank`` computes ``factor`` times slower from ``step`` on."""
    step: int
    rank: int
    factor: float = 1.3
    kind: str = field(default="straggler", init=False)


Fault = NonFinite | LossSpike | GradSpike | CorruptRank | Divergence | Straggler


@dataclass(frozen=True)
class Truth:
    """What a detector should report for one injected fault."""
    kind: str                # expected finding kind (FINDING_KINDS vocabulary)
    step: int                # first step that shows it
    ranks: tuple[int, ...]   # whom to blame; () = run-wide
    fault: Fault


@dataclass
class SimulatedRun:
    block: StepBlock
    truth: list[Truth]
    hosts: dict[int, str]    # rank -> host name (8 ranks per host)

    def __repr__(self) -> str:
        return (f"SimulatedRun(steps={self.block.n_steps}, ranks={self.block.n_ranks}, "
                f"truth={[(t.kind, t.step, t.ranks) for t in self.truth]})")


# ----------------------------------------------------------------------------------- generator
def simulate_run(
    n_steps: int = 10_000,
    n_ranks: int = 64,
    seed: int = 0,
    faults: Sequence[Fault] = (),
    *,
    first_step: int = 0,
    warmup_steps: int = 500,
    lr_decay_steps: int = 100_000,
    peak_lr: float = 3e-4,
    loss_start: float = 10.5,
    loss_floor: float = 1.8,
    loss_rank_sigma: float = 0.04,
    loss_step_sigma: float = 0.01,
    grad_sigma: float = 0.12,
    local_grad_sigma: float = 0.08,
    compute_time_s: float = 0.40,
    comm_time_s: float = 0.08,
    time_jitter: float = 0.02,
    slow_step_every: int = 500,
    missing_fraction: float = 0.0,
    metrics: Sequence[str] = METRICS,
) -> SimulatedRun:
    """Build a seeded trace of ``n_steps`` x ``n_ranks`` with the given faults injected.

    Steps are ``first_step .. first_step + n_steps - 1``; ranks are ``0 .. n_ranks - 1``.
    ``missing_fraction`` masks that share of (step, rank, metric) cells as not reported
    (``present=False``; the filler is NaN, which detectors must ignore). ``metrics`` restricts
    which metrics the block carries. Sigmas are in log units (0.04 ~ 4 % spread).
    """
    rng = np.random.default_rng(seed)
    n, r = int(n_steps), int(n_ranks)
    steps = np.arange(first_step, first_step + n, dtype=np.int64)
    t = steps.astype(np.float64)

    decay = np.clip((t - warmup_steps) / max(1.0, lr_decay_steps - warmup_steps), 0.0, 1.0)
    lr = np.where(t < warmup_steps, peak_lr * (t + 1) / warmup_steps,
                  peak_lr * (0.1 + 0.45 * (1 + np.cos(np.pi * decay))))
    progress = np.cumsum(lr) / peak_lr                     # "steps at peak lr" done so far
    loss_curve = loss_floor + (loss_start - loss_floor) * (1.0 + progress / 60.0) ** -0.6

    # Common per-step factor (AR(1) in log space) and per-rank micro-batch factor.
    common = _ar1(rng, n, phi=0.5, sigma=loss_step_sigma)
    log_loss = np.log(loss_curve)[:, None] + common[:, None] \
        + rng.normal(0.0, loss_rank_sigma, (n, r))

    grad_curve = 0.6 + 3.0 * np.exp(-progress / 100.0)
    log_grad = np.log(grad_curve) + _ar1(rng, n, phi=0.3, sigma=grad_sigma)
    log_local = log_grad[:, None] + np.log(1.6) + rng.normal(0.0, local_grad_sigma, (n, r))

    rank_speed = rng.normal(0.0, 0.01, r)                  # fixed hardware differences
    log_compute = np.log(compute_time_s) + rank_speed[None, :] + rng.normal(0.0, time_jitter, (n, r))
    data = rng.exponential(0.01, (n, r))
    slow_steps = np.zeros(n)
    if slow_step_every > 0:
        slow_steps[(steps % slow_step_every) == slow_step_every - 1] = 5.0 * compute_time_s

    vals = {
        "lr": np.repeat(lr[:, None], r, axis=1),
        "log_loss": log_loss, "log_grad": np.repeat(log_grad[:, None], r, axis=1),
        "log_local": log_local, "log_compute": log_compute,
    }
    truth = [_inject(fault, vals, steps) for fault in faults]

    compute = np.exp(vals["log_compute"])
    busy = compute + data
    slowest = busy.max(axis=1)
    comm = comm_time_s * np.exp(rng.normal(0.0, time_jitter / 2, (n, 1))) + (slowest[:, None] - busy)
    step_time = (slowest[:, None] + comm_time_s + slow_steps[:, None]
                 + np.abs(rng.normal(0.0, 1e-4, (n, r))))
    comm = comm + slow_steps[:, None]

    out = {
        "loss": np.exp(vals["log_loss"]), "grad_norm": np.exp(vals["log_grad"]),
        "local_grad_norm": np.exp(vals["log_local"]), "step_time": step_time,
        "compute_time": compute, "comm_time": comm, "data_time": data, "lr": vals["lr"],
    }
    for fault in faults:
        if isinstance(fault, NonFinite):
            _inject_non_finite(fault, out, steps)

    values = {m: out[m] for m in metrics}
    present = {m: np.ones((n, r), dtype=bool) for m in values}
    if missing_fraction > 0:
        for m in values:
            present[m] = rng.random((n, r)) >= missing_fraction
            values[m] = np.where(present[m], values[m], np.nan)
    block = StepBlock(steps=steps, ranks=np.arange(r, dtype=np.int64), values=values, present=present)
    hosts = {i: f"node{i // 8:04d}" for i in range(r)}
    return SimulatedRun(block=block, truth=truth, hosts=hosts)


def _ar1(rng: np.random.Generator, n: int, phi: float, sigma: float) -> np.ndarray:
    """Stationary AR(1) series with marginal standard deviation ``sigma``."""
    e = rng.normal(0.0, sigma * np.sqrt(1 - phi * phi), n)
    out = np.empty(n)
    acc = rng.normal(0.0, sigma)
    for i in range(n):   # O(n) scalar loop; n is small compared with n * ranks elsewhere
        acc = phi * acc + e[i]
        out[i] = acc
    return out


def _pos(steps: np.ndarray, step: int) -> int:
    """Row position of ``step`` (clipped into the trace)."""
    return int(np.clip(np.searchsorted(steps, step), 0, len(steps)))


def _inject(fault: Fault, v: dict[str, np.ndarray], steps: np.ndarray) -> Truth:
    """Apply a fault to the log-space arrays in place (non-finite values come later)."""
    i = _pos(steps, fault.step)
    if isinstance(fault, NonFinite):
        return Truth("non_finite", fault.step, (fault.rank,), fault)
    if isinstance(fault, LossSpike):
        cols = slice(None) if fault.ranks is None else list(fault.ranks)
        v["log_loss"][i:i + fault.duration, cols] += np.log(fault.factor)
        return Truth("loss_spike", fault.step, () if fault.ranks is None else tuple(sorted(fault.ranks)), fault)
    if isinstance(fault, GradSpike):
        v["log_grad"][i] += np.log(fault.factor)
        v["log_local"][i] += np.log(fault.factor)
        j = i + fault.lead_steps
        # The loss rises over the lead steps and peaks at step + lead_steps, then decays.
        ramp = np.log(fault.loss_factor) * np.array([0.25, 0.5, 1.0, 0.5, 0.25])
        for k, bump in enumerate(ramp):
            row = j - 2 + k
            if i < row < len(steps):
                v["log_loss"][row] += bump
        return Truth("grad_spike", fault.step, (), fault)
    if isinstance(fault, CorruptRank):
        v["log_local"][i:, fault.rank] += np.log(fault.local_grad_scale)
        v["log_loss"][i:, fault.rank] += np.log(fault.loss_scale)
        v["log_grad"][i:, fault.rank] += np.log(fault.grad_norm_scale)
        return Truth("rank_outlier", fault.step, (fault.rank,), fault)
    if isinstance(fault, Divergence):
        ramp = fault.rate * np.arange(len(steps) - i)
        v["log_loss"][i:] += ramp[:, None]
        v["log_grad"][i:] += (fault.grad_rate * np.arange(len(steps) - i))[:, None]
        return Truth("divergence", fault.step, (), fault)
    if isinstance(fault, Straggler):
        v["log_compute"][i:, fault.rank] += np.log(fault.factor)
        return Truth("straggler", fault.step, (fault.rank,), fault)
    raise TypeError(f"unknown fault {fault!r}")


def _inject_non_finite(fault: NonFinite, out: dict[str, np.ndarray], steps: np.ndarray) -> None:
    i = _pos(steps, fault.step)
    out["local_grad_norm"][i, fault.rank] = fault.value
    if fault.in_loss:
        out["loss"][i, fault.rank] = fault.value
    # The all-reduce spreads it: the global norm is non-finite everywhere from this step, and the
    # update poisons the weights, so from the next step every rank's loss and local norm is NaN.
    out["grad_norm"][i:] = np.nan if np.isnan(fault.value) else np.inf
    out["loss"][i + 1:] = np.nan
    out["local_grad_norm"][i + 1:] = np.nan


# ------------------------------------------------------------------------------------- blocks
def iter_blocks(
    block: StepBlock,
    sizes: int | Sequence[int] = 64,
    *,
    seed: int | None = None,
    max_size: int = 64,
) -> Iterator[StepBlock]:
    """Yield ``block`` as consecutive row blocks.

    ``sizes`` is one block size, or a sequence of sizes used in turn (cycled). With ``seed`` the
    sizes are instead drawn uniformly from ``1..max_size`` by a seeded generator (for split
    properties). Every row is yielded exactly once, in order.
    """
    rng = np.random.default_rng(seed) if seed is not None else None
    cycle = [int(sizes)] if isinstance(sizes, (int, np.integer)) else [int(s) for s in sizes]
    if any(s < 1 for s in cycle) or not cycle:
        raise ValueError(f"block sizes must be >= 1, got {sizes!r}")
    start, k = 0, 0
    while start < block.n_steps:
        size = int(rng.integers(1, max_size + 1)) if rng is not None else cycle[k % len(cycle)]
        yield block.slice_steps(start, start + size)
        start += size
        k += 1


def split_at(block: StepBlock, cuts: Sequence[int]) -> list[StepBlock]:
    """Split at the given row positions (e.g. ``[10, 11, 500]``) into consecutive blocks."""
    edges = [0, *sorted(int(c) for c in cuts if 0 < c < block.n_steps), block.n_steps]
    return [block.slice_steps(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
