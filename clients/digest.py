"""A replica's fingerprint: a cheap, deterministic digest of this rank's parameters.

Data-parallel replicas must hold bit-identical parameters after every update, so one small value
per rank every few steps decides exactly whether a replica was silently corrupted (a flipped bit
in a weight or in the optimizer's state, a broken device), where statistics on the loss take tens
of steps or never see it.

How it is computed, where the tensors live (no copy to the host): each tensor's bits are read as
integers of its element size (``view``, no conversion) and summed twice into int64 with torch ops
on its own device, once plainly and once weighted by a fixed pattern of small odd weights (the
products wrap in int32, which is deterministic; so two changes that cancel in the plain sum, or a
swap of two values, still change the weighted one). Integer sums do not depend on the order of
the reduction, so two replicas with the same bits give the same sums on any device and kernel. Small tensors are concatenated first.
Tensors are reduced in slices of ``CHUNK_ELEMENTS`` (256 k elements: a slice stays in the CPU's
cache between its two reductions, measured 1.6x faster than 64 k or whole tensors, and the
temporaries stay small on an accelerator). The sums are stacked on the device and
copied to the host once (16 bytes per piece), then hashed (BLAKE2b, 8 bytes) with the tensors'
shapes and dtypes into 16 hex digits. Any single flipped bit changes the plain sum of its tensor, so it always changes the
digest.

torch is imported lazily, only when a fingerprint is taken: importing ``clients`` stays
standard-library only.

Example (a model, or any iterable of tensors, or a state dict)::

    digest = param_digest(model)                       # '3f9c0e12a4b7d655'
    digest = param_digest(model, optimizer=opt)        # parameters and optimizer state

A model sharded with FSDP2 (``fully_shard``: ``DTensor`` parameters) is digested as this rank's
shards; ranks that hold the same shard (``replica_group``) must agree.
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable

# Elements reduced per torch call: bounds the temporaries on the device to a few MiB whatever the
# tensor's size (a 1 B-parameter embedding does not double its memory).
CHUNK_ELEMENTS = 1 << 18
SMALL_ELEMENTS = 1 << 16      # tensors below this size are reduced together
# Default of ``fingerprint_every`` in the callbacks and the example trainer: a fingerprint every
# this many steps. Chosen from bench/fingerprint.py (README, "Exact checks"): on the CPU a
# fingerprint of the parameters costs about 11 % of a step of the example model and 10 % of a
# step of a 100 M-parameter model (memory-bound: one pass over the weights), so one every 20
# steps costs about 0.5 % of the training time (with the optimizer state: 1.1-1.5 %).
FINGERPRINT_EVERY = 20
_WEIGHT_PERIOD = 61          # weights 1, 3, 5, ... repeating: the period is prime, so a pattern in
_weights_cache: dict = {}    # the data rarely lines up with it (device -> weights)


def due(step: int, every: int) -> bool:
    """True at the steps a fingerprint is taken: every ``every`` steps, at the steps after whose
    update a checkpoint every multiple of ``every`` steps is saved (``(step + 1) % every == 0``),
    so a checkpoint is at a fingerprint and the proof reaches it. ``every`` <= 0: never."""
    return every > 0 and (step + 1) % every == 0


def param_digest(model_or_params: Any, optimizer: Any = None) -> str:
    """16 hex digits that change when any bit of the parameters (and, with ``optimizer``, of its
    state) changes. Equal on every replica that holds the same bits.

    ``model_or_params``: an ``nn.Module`` (its ``parameters()``, in order), a state dict, or an
    iterable of tensors. ``optimizer``: a torch optimizer whose per-parameter state tensors
    (moments, step counters) are included, in the order of its parameter groups.
    """
    import torch

    tensors = [_local(t) for t in _tensors(model_or_params)]
    if optimizer is not None:
        tensors += [_local(t) for t in _optimizer_tensors(optimizer)]
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:   # the layout is part of the state: shapes and dtypes, on the host, free
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
    if tensors:
        with torch.no_grad():
            sums = [s for piece in _pieces(tensors) for s in _piece_sums(piece)]
            # One device-to-host copy for the whole model (2 int64 per piece), per device.
            if len({s.device for s in sums}) == 1:
                values = torch.stack(sums).cpu()
            else:
                values = torch.stack([s.cpu() for s in sums])
        h.update(b"".join(int(v).to_bytes(8, "little", signed=True) for v in values.tolist()))
    return h.hexdigest()


def _pieces(tensors: list) -> Iterable[Any]:
    """The tensors' bits as flat integer tensors: each large tensor on its own, the small ones of
    a device and element size concatenated (one reduction instead of dozens of tiny ones, whose
    fixed cost per torch call dominates a small model's fingerprint)."""
    import torch

    small: dict[tuple, list] = {}
    for t in tensors:
        bits = _int_view(t)
        if bits.numel() >= SMALL_ELEMENTS:
            yield bits
        else:
            small.setdefault((bits.device, bits.dtype), []).append(bits)
    for group in small.values():
        yield group[0] if len(group) == 1 else torch.cat(group)


def _tensors(obj: Any) -> Iterable[Any]:
    parameters = getattr(obj, "parameters", None)
    if callable(parameters):
        return (p for p in parameters())
    if isinstance(obj, dict):
        return (v for _, v in sorted(obj.items()) if hasattr(v, "dtype"))
    return (t for t in obj if hasattr(t, "dtype"))


def _local(t: Any) -> Any:
    """The part of ``t`` this rank holds: a sharded ``DTensor`` (FSDP2's parameters and their
    optimizer state) is digested as its local shard, with no collective; others as they are."""
    to_local = getattr(t, "to_local", None)
    return (to_local() if callable(to_local) else t).detach()


def _optimizer_tensors(optimizer: Any) -> Iterable[Any]:
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in sorted(state):
                value = state[key]
                if hasattr(value, "dtype"):
                    yield value


def _int_view(t: Any) -> Any:
    import torch

    flat = t.reshape(-1)
    if flat.dtype == torch.bool:
        return flat.to(torch.uint8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    size = flat.element_size()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    return flat if flat.dtype == as_int else flat.view(as_int)


def _weights(n: int, device: Any) -> Any:
    """The first ``n`` weights, a view of one tensor per device grown to the largest chunk."""
    import torch

    w = _weights_cache.get(str(device))
    if w is None or w.numel() < n:
        w = _weights_cache[str(device)] = ((torch.arange(n, device=device) % _WEIGHT_PERIOD) * 2
                                           + 1).to(torch.int32)
    return w[:n]


def _piece_sums(bits: Any) -> tuple[Any, Any]:
    """(plain, weighted) int64 sums of a flat integer tensor, as 0-d tensors on its device."""
    import torch

    if bits.numel() <= CHUNK_ELEMENTS:
        return (bits.sum(dtype=torch.int64),
                (bits * _weights(bits.numel(), bits.device)).sum(dtype=torch.int64))
    plain = torch.zeros((), dtype=torch.int64, device=bits.device)
    weighted = torch.zeros((), dtype=torch.int64, device=bits.device)
    for start in range(0, bits.numel(), CHUNK_ELEMENTS):
        chunk = bits[start:start + CHUNK_ELEMENTS]
        plain += chunk.sum(dtype=torch.int64)
        weighted += (chunk * _weights(chunk.numel(), chunk.device)).sum(dtype=torch.int64)
    return plain, weighted
