"""This rank's gradient norm *before* the all-reduce, from a DDP communication hook.

Under ``DistributedDataParallel`` the gradients a rank sees after ``backward()`` are already
averaged over ranks, so a NaN or a blow-up on one rank shows on every rank and its origin is lost.
DDP hands each gradient bucket to a communication hook before reducing it; :class:`LocalGradNorm`
registers one that adds the bucket's squared L2 norm to a running sum and then does DDP's own
all-reduce (``default_hooks.allreduce_hook``), so training is unchanged. :meth:`take` returns the
step's ``local_grad_norm`` (a 0-d tensor, no host sync) and starts the next step. With gradient
accumulation DDP reduces once, on the last micro-batch (``no_sync`` before), so the norm is that of
the accumulated local gradient, as the optimizer would see it without the all-reduce.

Usage (a plain loop or ``accelerate``; ``healthsvc_client.lightning.HealthCallback`` does this itself)::

    ddp_model = DistributedDataParallel(model)
    local = LocalGradNorm.attach(ddp_model)          # None when not DDP or a hook is already set
    ...
    loss.backward()
    health.log(loss=loss.item(), local_grad_norm=local.take(), step=step)

Importing this module is cheap; ``torch`` is imported when a hook is attached.
"""
from __future__ import annotations

import threading
from typing import Any


class LocalGradNorm:
    """Sums the squared norms of the buckets DDP reduces; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # buckets may be reduced from autograd's worker threads
        self._squares: list[Any] = []

    def __repr__(self) -> str:
        return f"LocalGradNorm(buckets_pending={len(self._squares)})"

    @classmethod
    def attach(cls, ddp_model: Any) -> "LocalGradNorm | None":
        """Register the hook on a ``DistributedDataParallel`` model; None when ``ddp_model`` is not
        one, or already has a communication hook (DDP allows one): then no ``local_grad_norm``."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(ddp_model, DistributedDataParallel):
            return None
        hook = cls()
        try:
            ddp_model.register_comm_hook(None, hook._hook)
        except RuntimeError:
            return None
        return hook

    def _hook(self, process_group, bucket):  # unannotated: DDP checks a hook's annotations
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        square = torch.linalg.vector_norm(bucket.buffer().detach().float()) ** 2
        with self._lock:
            self._squares.append(square)
        return allreduce_hook(process_group, bucket)

    def take(self) -> Any:
        """The L2 norm of this rank's local gradients since the last ``take`` (None if DDP
        reduced nothing, e.g. on an accumulation micro-batch)."""
        import torch

        with self._lock:
            squares, self._squares = self._squares, []
        if not squares:
            return None
        return torch.sqrt(torch.stack(squares).sum())
