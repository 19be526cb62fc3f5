"""PyTorch Lightning integration: a ``Callback`` that reports every rank's own loss, every step.

Lightning's loggers run on rank 0 and see ``self.log(..., sync_dist=True)`` averages; a NaN or a
straggler on rank 5 is invisible there. This callback runs on every rank and pushes that rank's
record (``loss`` of its own micro-batch, ``local_grad_norm`` of its own gradients before the
all-reduce, the global ``grad_norm`` the optimizer sees before clipping, ``lr`` (the one the update used, read
before the scheduler steps), ``step_time``,
``data_time``, ``compute_time``, and ``data_cursor``: the samples its loader has yielded since the
run began) through ``healthsvc_client.Run``, and registers every checkpoint
``ModelCheckpoint`` (or anything else) saves through ``trainer.save_checkpoint``.

Usage::

    from healthsvc_client.lightning import HealthCallback
    trainer = L.Trainer(callbacks=[HealthCallback("http://healthsvc:8000", run_id="exp-42")], ...)

Steps: ``step`` is ``trainer.global_step`` before the optimizer update, so it starts at 0 and a
checkpoint saved after N updates holds the state after the update of step N-1. With gradient
accumulation the loss is the mean over the micro-batches of the step. ``compute_time`` includes the
gradient all-reduce, which DDP overlaps with backward; use ``healthsvc_client.timing.StepTimer`` in a plain
loop when you need ``comm_time``.

``local_grad_norm``: under DDP, a communication hook (``healthsvc_client.grad_hooks.LocalGradNorm``) takes
each gradient bucket's norm before DDP all-reduces it, so the rank a NaN came from is named. It is
left out when the strategy already registered a hook of its own (DDP allows one). In a
one-process run it equals ``grad_norm`` (there is no all-reduce).

``data_cursor``: counted from the batches the loader yields (epochs before this one times the
batches of an epoch, plus this epoch's batches, times the first batch's size), not from Lightning's
counters, which a resume restores whatever the loader does: a plain ``DataLoader`` resumed mid-epoch
starts the epoch's samples again, the cursor goes back and the service raises ``resume_mismatch``.
A stateful loader (``state_dict``/``load_state_dict``, restored by Lightning) continues.

Checkpoints: the callback wraps ``trainer.save_checkpoint``, which ``ModelCheckpoint`` calls, and
rank 0 registers each file with ``step = trainer.global_step - 1`` (the state after that step's
update), ``duration_s`` (the wall time the save blocked training, the barrier included) and
``bytes``.

Replica fingerprints: every ``fingerprint_every`` steps (default
``healthsvc_client.digest.FINGERPRINT_EVERY``; 0 turns them off) the callback sends the digest of this
rank's parameters after the step's update (``param_digest``; with ``fingerprint_optimizer=True``
the optimizer's state too), at the steps a checkpoint every multiple of that many steps holds.

Importing this module is cheap; ``lightning`` (or ``pytorch_lightning``) is imported the first time
``HealthCallback`` is used.
"""
from __future__ import annotations

import os
import time
from typing import Any

_cache: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name == "HealthCallback":
        if name not in _cache:
            _cache[name] = _build_callback_class()
        return _cache[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _lightning_callback_base() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
        return Callback
    except ImportError:  # the older standalone package
        from pytorch_lightning.callbacks import Callback as StandaloneCallback
        return StandaloneCallback


def grad_total_norm(parameters: Any) -> Any:
    """L2 norm over all gradients as a 0-d tensor (no host sync; the sender thread converts it)."""
    import torch

    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    if not grads:
        return None
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def _batch_size(batch: Any) -> int | None:
    """Samples in a batch, found as ``self.log`` finds them (the first tensor's first dimension)."""
    try:
        from lightning.pytorch.utilities.data import extract_batch_size
    except ImportError:
        from pytorch_lightning.utilities.data import extract_batch_size
    try:
        return extract_batch_size(batch)
    except Exception:  # noqa: BLE001 - a batch of no tensor: no data_cursor, training goes on
        return None


def _data_cursor(trainer: Any, epoch_batches: int, batch_size: int | None) -> int | None:
    """Samples this rank's loader has yielded since the start of the run (after this step).

    Counted from the data, not from the loop's counters: after a resume mid-epoch, Lightning
    restores its own batch counters, but a plain ``DataLoader`` starts its epoch again from the
    first sample (Lightning warns "your dataloader is not resumable") and so does this count,
    which is what lets the service raise ``resume_mismatch``. A loader with ``state_dict`` /
    ``load_state_dict`` (a stateful loader Lightning restores) continues where it was; then the
    loop's count of this epoch's batches is the loader's position. None with no length per epoch
    (an iterable dataset) or no tensor in the batch.
    """
    batches_per_epoch = trainer.num_training_batches
    if batch_size is None or not isinstance(batches_per_epoch, int):
        return None
    loaders = trainer.train_dataloader
    loaders = list(loaders.values()) if isinstance(loaders, dict) else (
        list(loaders) if isinstance(loaders, (list, tuple)) else [loaders])
    if all(hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict") for loader in loaders):
        epoch_batches = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    return (trainer.current_epoch * batches_per_epoch + epoch_batches) * batch_size


def _build_callback_class() -> type:
    # Any: the base is one of two packages' classes, chosen at run time (mypy takes no variable
    # of type `type` for a base class).
    Callback: Any = _lightning_callback_base()
    from healthsvc_client.client import Run
    from healthsvc_client.digest import FINGERPRINT_EVERY, due
    from healthsvc_client.grad_hooks import LocalGradNorm

    class HealthCallback(Callback):
        """Per-rank health reporting. Pass ``run=`` to reuse a ``healthsvc_client.Run`` you created, or
        ``url``/``run_id`` (plus any ``Run`` option) to let the callback create one per rank at
        ``setup``, with ``rank=trainer.global_rank`` and ``world_size=trainer.world_size``."""

        def __init__(self, url: str | None = None, run_id: str | None = None, *, run: Run | None = None,
                     log_grad_norm: bool = True, finish_on_end: bool = True,
                     fingerprint_every: int = FINGERPRINT_EVERY, fingerprint_optimizer: bool = False,
                     **run_options: Any) -> None:
            super().__init__()
            self.url, self.run_id = url, run_id
            self.run = run
            self.log_grad_norm = log_grad_norm
            self.fingerprint_every = fingerprint_every
            self.fingerprint_optimizer = fingerprint_optimizer
            self.finish_on_end = finish_on_end
            self._run_options = run_options
            self._owns_run = run is None
            self._last_end_s: float | None = None
            self._local: LocalGradNorm | None = None
            self._single_process = False
            self._epoch_batches = 0   # batches the loader yielded this epoch, in this process
            self._batch_size: int | None = None
            self._reset_step()

        def __repr__(self) -> str:
            return f"HealthCallback(run={self.run!r})"

        def _reset_step(self) -> None:
            self._step_start_s: float | None = None
            self._data_s = 0.0
            self._losses: list[Any] = []
            self._grad_norm: Any = None
            self._local_grad_norm: Any = None
            self._lr: float | None = None

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if self.run is None:
                self.run = Run(self.url, self.run_id or "", trainer.global_rank,
                               world_size=trainer.world_size, **self._run_options)
            self._wrap_save_checkpoint(trainer)

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            # After the strategy wrapped the model: the DDP module exists now.
            self._single_process = trainer.world_size == 1
            if self.log_grad_norm and not self._single_process and self._local is None:
                self._local = LocalGradNorm.attach(trainer.strategy.model)

        def _wrap_save_checkpoint(self, trainer: Any) -> None:
            original = getattr(trainer, "save_checkpoint", None)
            if original is None or getattr(original, "_healthsvc", False):
                return
            callback = self

            def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                result = original(filepath, *args, **kwargs)
                callback._register_checkpoint(trainer, str(filepath), time.perf_counter() - start)
                return result

            save_checkpoint._healthsvc = True  # type: ignore[attr-defined]
            trainer.save_checkpoint = save_checkpoint

        def _register_checkpoint(self, trainer: Any, path: str, duration_s: float) -> None:
            if self.run is None or not trainer.is_global_zero or trainer.global_step < 1:
                return
            try:
                size = os.path.getsize(path)
            except OSError:  # a remote filesystem or a directory checkpoint: no size
                size = None
            self.run.checkpoint(trainer.global_step - 1, os.path.abspath(path) if "://" not in path else path,
                                duration_s=duration_s, bytes=size)

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self._epoch_batches = 0  # a new iterator over the loader: its sampler starts again

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            now = time.perf_counter()
            self._epoch_batches += 1
            if self._batch_size is None:
                self._batch_size = _batch_size(batch)
            if self._step_start_s is None:
                self._step_start_s = now if self._last_end_s is None else self._last_end_s
                self._global_step_at_start = trainer.global_step
            if self._last_end_s is not None:
                self._data_s += now - self._last_end_s
            if self.run is not None:
                self.run.set_phase("compute", step=trainer.global_step)

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            # Called after the gradients are accumulated (and all-reduced) and before clipping;
            # also before the scheduler steps (before on_train_batch_end): the lr this update uses.
            self._lr = optimizer.param_groups[0]["lr"]
            if self.log_grad_norm:
                self._grad_norm = grad_total_norm(pl_module.parameters())
                if self._local is not None:
                    self._local_grad_norm = self._local.take()
                elif self._single_process:
                    self._local_grad_norm = self._grad_norm

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            now = time.perf_counter()
            self._last_end_s = now
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None and hasattr(loss, "detach"):
                self._losses.append(loss.detach())
            if trainer.global_step == self._global_step_at_start:
                return  # accumulating: the optimizer has not stepped yet
            run = self.run
            if run is not None:
                record: dict[str, Any] = {}
                if self._losses:
                    import torch

                    record["loss"] = (self._losses[0] if len(self._losses) == 1
                                      else torch.stack(self._losses).float().mean())
                if self._grad_norm is not None:
                    record["grad_norm"] = self._grad_norm
                if self._local_grad_norm is not None:
                    record["local_grad_norm"] = self._local_grad_norm
                if self._lr is not None:
                    record["lr"] = self._lr
                cursor = _data_cursor(trainer, self._epoch_batches, self._batch_size)
                if cursor is not None:
                    record["data_cursor"] = cursor
                step_time = now - (self._step_start_s or now)
                record.update(step_time=step_time, data_time=self._data_s,
                              compute_time=max(0.0, step_time - self._data_s))
                if due(self._global_step_at_start, self.fingerprint_every):
                    optimizer = (trainer.optimizers[0] if self.fingerprint_optimizer and trainer.optimizers
                                 else None)
                    # In the step's own record (see Run.fingerprint_fields): logged apart after
                    # the digest, it can reach the service as a repeated step, read as a restart.
                    record.update(run.fingerprint_fields(pl_module, optimizer=optimizer))
                run.log(record, step=self._global_step_at_start)
                run.set_phase("data")
            self._reset_step()

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            if self.run is not None:
                self.run.alert(f"training raised {type(exception).__name__}: {exception}",
                               severity="critical", step=trainer.global_step)
                self.run.flush(5.0)

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            if self.run is not None and self._owns_run and self.finish_on_end:
                self.run.finish()

    return HealthCallback
