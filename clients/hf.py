"""Hugging Face ``Trainer`` integration: every rank's own loss at every optimizer step.

The Trainer's ``on_log`` is no use for health: it fires every ``logging_steps``, reports the loss
averaged over ranks (and over the steps since the last log), and with ``logging_nan_inf_filter``
(on by default) replaces a NaN/Inf loss by the running average, which hides exactly what this
service looks for. So ``attach(trainer, ...)`` does two small things besides adding a callback:

- it wraps ``trainer.training_step`` on that instance. Its return value is this rank's micro-batch
  loss, detached, already scaled for gradient accumulation (the sum over the micro-batches of a step
  is the step's loss), before any cross-rank averaging or NaN filtering: exactly the per-rank
  per-step loss. Chosen over overriding ``compute_loss`` because the Trainer scales the loss for
  accumulation after ``compute_loss`` returns, in version-dependent ways; ``training_step`` has
  done that already.
- it wraps ``trainer.accelerator.clip_grad_norm_``, through which the Trainer computes the global
  gradient norm (before clipping, or with ``max_norm=inf`` when clipping is off), to report
  ``grad_norm`` without a second pass over the gradients.

The callback (``HealthCallback``) then logs, at ``on_step_end``, with ``step = state.global_step``
(1 after the first update, the number in the Trainer's ``checkpoint-N`` directories, so a
checkpoint at step N holds the state after the update of step N): ``loss``, ``grad_norm``,
``local_grad_norm`` (this rank's norm before the all-reduce, from a DDP communication hook,
``healthsvc_client.grad_hooks.LocalGradNorm``, registered on ``trainer.model_wrapped`` at train begin; in a
one-process run it equals ``grad_norm``), ``lr`` (the one the update used, read at
``on_optimizer_step``, before the scheduler steps), ``data_cursor`` (the samples this rank has
drawn: ``state.epoch`` times the loader's batches per epoch times ``per_device_train_batch_size``;
``state.epoch`` follows the epoch's data, the batches skipped on a resume included, so a resume
with ``ignore_data_skip`` makes it go back and the service raises ``resume_mismatch``),
``step_time``, ``data_time`` (previous step end to this step's begin) and ``compute_time`` (time in
``training_step``: forward and backward, including the all-reduce DDP overlaps with backward). On
rank 0, ``on_save`` registers ``{output_dir}/checkpoint-{N}`` with ``duration_s`` (the wall time
of the Trainer's ``_save_checkpoint``, which ``attach`` also wraps: model, optimizer, scheduler and
RNG state; without it, the time from the step's end to ``on_save``) and ``bytes`` (the files in
the directory).

Replica fingerprints: every ``fingerprint_every`` steps (default
``healthsvc_client.digest.FINGERPRINT_EVERY``; 0 turns them off; at the global steps divisible by it, where
the Trainer's ``checkpoint-N`` directories are when ``save_steps`` is a multiple of it) the callback
sends the digest of this rank's parameters after the update (``param_digest``; with
``fingerprint_optimizer=True`` the optimizer's state too).

``accelerate``: a loop written with ``accelerate.Accelerator`` needs no integration; see
``examples/accelerate_train.py`` and docs/client.md.

Usage::

    from healthsvc_client.hf import attach
    trainer = Trainer(model=model, args=args, train_dataset=ds)
    attach(trainer, "http://healthsvc:8000", run_id="exp-42")
    trainer.train()

Importing this module is cheap; ``transformers`` is imported when ``attach`` or ``HealthCallback``
is first used.
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


def attach(trainer: Any, url: str | None = None, run_id: str | None = None, *, run: Any = None,
           **run_options: Any) -> Any:
    """Instrument ``trainer`` (see the module docstring) and add a ``HealthCallback``; returns it.

    Pass ``run=`` to reuse a ``healthsvc_client.Run``, or ``url``/``run_id`` (plus ``Run`` options) to create
    one per rank with ``rank=args.process_index`` and ``world_size=args.world_size``.
    """
    callback = __getattr__("HealthCallback")(url, run_id, run=run, **run_options)
    callback._trainer = trainer  # for the DDP-wrapped model (``model_wrapped``) at train begin
    original_step = trainer.training_step

    def training_step(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        loss = original_step(*args, **kwargs)
        callback._compute_s += time.perf_counter() - start
        callback._micro_losses.append(loss.detach() if hasattr(loss, "detach") else loss)
        return loss

    trainer.training_step = training_step
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None:
        original_clip = accelerator.clip_grad_norm_

        def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            norm = original_clip(*args, **kwargs)
            callback._grad_norm = norm.detach() if hasattr(norm, "detach") else norm
            return norm

        accelerator.clip_grad_norm_ = clip_grad_norm_
    original_save = getattr(trainer, "_save_checkpoint", None)  # private; absent in some versions
    if original_save is not None:
        def _save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original_save(*args, **kwargs)
            finally:
                callback._save_s = time.perf_counter() - start

        trainer._save_checkpoint = _save_checkpoint
    trainer.add_callback(callback)
    return callback


def _dir_bytes(path: str) -> int | None:
    """Total size of the files under ``path``; None when it is not a local directory."""
    if not os.path.isdir(path):
        return None
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _data_cursor(args: Any, state: Any, train_dataloader: Any) -> int | None:
    """Samples this rank has drawn from its data loader, from the Trainer's own data position.

    ``state.epoch`` is ``epoch + (b + 1) / steps_in_epoch`` where ``b`` is the index of the
    micro-batch in the epoch's data (the batches the Trainer skipped to resume mid-epoch included;
    with ``ignore_data_skip`` the epoch's data starts again at 0, and so does ``b``), so
    ``state.epoch * len(train_dataloader)`` is the micro-batches drawn, times the per-device batch
    size. None when the loader has no length (an iterable dataset: the Trainer cannot tell).
    """
    try:
        batches_per_epoch = len(train_dataloader)
    except TypeError:
        return None
    if state.epoch is None or not batches_per_epoch:
        return None
    return round(state.epoch * batches_per_epoch) * args.per_device_train_batch_size


def _build_callback_class() -> type:
    from transformers import TrainerCallback

    from healthsvc_client.client import Run
    from healthsvc_client.digest import FINGERPRINT_EVERY
    from healthsvc_client.grad_hooks import LocalGradNorm

    class HealthCallback(TrainerCallback):
        """Per-rank step records for a ``Trainer`` instrumented by ``attach`` (which feeds it the
        micro-batch losses and the gradient norm). Used alone, it reports timings and lr only."""

        def __init__(self, url: str | None = None, run_id: str | None = None, *, run: Run | None = None,
                     finish_on_end: bool = True, fingerprint_every: int = FINGERPRINT_EVERY,
                     fingerprint_optimizer: bool = False, **run_options: Any) -> None:
            self.url, self.run_id = url, run_id
            self.run = run
            self.finish_on_end = finish_on_end
            self.fingerprint_every = fingerprint_every
            self.fingerprint_optimizer = fingerprint_optimizer
            self._run_options = run_options
            self._owns_run = run is None
            self._micro_losses: list[Any] = []
            self._grad_norm: Any = None
            self._lr: float | None = None
            self._compute_s = 0.0
            self._step_begin_s: float | None = None
            self._last_end_s: float | None = None
            self._data_s = 0.0
            self._save_s: float | None = None  # set by attach's _save_checkpoint wrapper
            self._trainer: Any = None           # set by attach
            self._local: LocalGradNorm | None = None
            self._single_process = False

        def __repr__(self) -> str:
            return f"HealthCallback(run={self.run!r})"

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.run is None:
                self.run = Run(self.url, self.run_id or "", args.process_index,
                               world_size=args.world_size, **self._run_options)
            # The Trainer has prepared (DDP-wrapped) the model by now.
            self._single_process = args.world_size == 1
            if self._trainer is not None and not self._single_process and self._local is None:
                self._local = LocalGradNorm.attach(self._trainer.model_wrapped)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            now = time.perf_counter()
            self._data_s = 0.0 if self._last_end_s is None else now - self._last_end_s
            self._step_begin_s = now
            if self.run is not None:
                self.run.set_phase("compute", step=state.global_step + 1)

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # The lr this update used: by on_step_end the scheduler has already moved to the next.
            optimizer = kwargs.get("optimizer")
            if optimizer is not None:
                self._lr = optimizer.param_groups[0]["lr"]

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            now = time.perf_counter()
            record: dict[str, Any] = {}
            if self._micro_losses:
                import torch

                losses = self._micro_losses
                record["loss"] = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
            if self._grad_norm is not None:
                record["grad_norm"] = self._grad_norm
            local = self._local.take() if self._local is not None else (
                self._grad_norm if self._single_process else None)
            if local is not None:
                record["local_grad_norm"] = local
            cursor = _data_cursor(args, state, kwargs.get("train_dataloader"))
            if cursor is not None:
                record["data_cursor"] = cursor
            optimizer = kwargs.get("optimizer")
            if self._lr is not None:
                record["lr"] = self._lr
            begin = self._step_begin_s if self._step_begin_s is not None else now
            record.update(step_time=(now - begin) + self._data_s, data_time=self._data_s,
                          compute_time=self._compute_s)
            if self.run is not None:
                model = kwargs.get("model")
                every = self.fingerprint_every
                if model is not None and every > 0 and state.global_step % every == 0:
                    # In the step's own record: logged apart, it could reach the service after
                    # the step's record was sent, and a repeated step reads as a restart.
                    record.update(self.run.fingerprint_fields(
                        model, optimizer=optimizer if self.fingerprint_optimizer else None))
                self.run.log(record, step=state.global_step)
                self.run.set_phase("data")
            self._micro_losses = []
            self._grad_norm = None
            self._lr = None
            self._compute_s = 0.0
            self._last_end_s = now

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            duration_s = self._save_s
            if duration_s is None and self._last_end_s is not None:
                duration_s = time.perf_counter() - self._last_end_s
            self._save_s = None
            if self.run is not None and state.is_world_process_zero:
                uri = os.path.abspath(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
                self.run.checkpoint(state.global_step, uri, duration_s=duration_s, bytes=_dir_bytes(uri))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.run is not None and self._owns_run and self.finish_on_end:
                self.run.finish()

    return HealthCallback
