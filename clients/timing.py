"""Where a step's time went, per rank: ``data_time``, ``compute_time``, ``comm_time``, ``step_time``.

Synchronous data-parallel training hides the straggler in ``step_time``: every rank waits at the
all-reduce, so all ranks report the same step time. The slow rank is the one with the highest
``compute_time``, or equivalently the least ``comm_time`` (it arrives last and waits least).

On the CPU (gloo), sections are timed with ``time.perf_counter``: collectives block the calling
thread, so the wall time inside ``timer.comm()`` is the time spent blocked. On a GPU pass
``device="cuda"``: sections are bracketed with CUDA events on the current stream (kernels and NCCL
collectives are asynchronous, so host wall time would measure launch cost only) and resolved in
``end_step`` with one ``synchronize`` on the last event, the same price as the ``loss.item()`` most
loops already pay. torch is imported only when a CUDA timer is created.

Example (plain PyTorch loop)::

    timer = StepTimer(run=run)                  # run: healthsvc_client.Run; sets the heartbeat phase too
    for step in range(steps):
        timer.start_step(step)
        with timer.data():
            x, y = next(batches)
        with timer.compute():
            loss = model(x, y); loss.backward()
        with timer.comm():
            for p in model.parameters(): dist.all_reduce(p.grad)
        with timer.compute():
            opt.step()
        run.log(loss=loss.item(), step=step, **timer.end_step())
        # {'step_time': 0.052, 'data_time': 0.001, 'compute_time': 0.031, 'comm_time': 0.019}

Times are seconds; a section used several times in a step accumulates.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

SECTIONS: dict[str, str] = {"data": "data", "compute": "compute", "comm": "collective"}


class _Section:
    __slots__ = ("_timer", "_name", "_start", "_previous_phase")

    def __init__(self, timer: StepTimer, name: str) -> None:
        self._timer = timer
        self._name = name
        self._start: Any = None
        self._previous_phase: str | None = None

    def __enter__(self) -> _Section:
        run = self._timer.run
        if run is not None:
            self._previous_phase = run._phase
            run.set_phase(SECTIONS[self._name])
        self._start = self._timer._mark()
        return self

    def __exit__(self, *exc: object) -> None:
        timer = self._timer
        timer._spans.append((self._name, self._start, timer._mark()))
        run = timer.run
        if run is not None and self._previous_phase is not None:
            run.set_phase(self._previous_phase)


class StepTimer:
    """Times the data, compute and comm sections of each step (seconds).

    Arguments:
        run: optional ``healthsvc_client.Run`` whose heartbeat phase follows the section being timed
            (data / compute / collective), and whose step-in-progress follows ``start_step``.
        device: "cpu" (perf counters) or "cuda"/"cuda:N"/a torch.device (CUDA events).
        clock: monotonic clock in seconds for the CPU path (injectable for tests).
        event_factory: for the CUDA path, makes an object with ``record()``, ``synchronize()`` and
            ``elapsed_time(other) -> ms`` (default ``torch.cuda.Event(enable_timing=True)``).
    """

    def __init__(self, run: Any = None, device: Any = "cpu",
                 clock: Callable[[], float] = time.perf_counter,
                 event_factory: Callable[[], Any] | None = None) -> None:
        self.run = run
        self.uses_events = str(device).startswith("cuda") or event_factory is not None
        if self.uses_events and event_factory is None:
            import torch  # noqa: PLC0415 - only a CUDA user pays for the import

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)
        self._event_factory = event_factory
        self._clock = clock
        self._spans: list[tuple[str, Any, Any]] = []
        self._step_start: Any = None
        self._step_start_s = 0.0

    def __repr__(self) -> str:
        return f"StepTimer({'cuda events' if self.uses_events else 'perf_counter'}, run={self.run!r})"

    def _mark(self) -> Any:
        if self.uses_events:
            event = self._event_factory()  # type: ignore[misc]
            event.record()
            return event
        return self._clock()

    def start_step(self, step: int | None = None) -> None:
        """Begin a step (``step`` also becomes the heartbeat's step in progress)."""
        self._spans.clear()
        self._step_start = self._mark()
        self._step_start_s = self._clock()
        if self.run is not None and step is not None:
            self.run.set_phase("other", step=step)

    def data(self) -> _Section:
        """Waiting for the input batch."""
        return _Section(self, "data")

    def compute(self) -> _Section:
        """Forward, backward, optimizer: work this rank does alone."""
        return _Section(self, "compute")

    def comm(self) -> _Section:
        """Blocked in collectives (all-reduce of gradients, barriers)."""
        return _Section(self, "comm")

    def end_step(self) -> dict[str, float]:
        """Times of the step just finished: step_time, data_time, compute_time, comm_time (s).

        ``step_time`` is wall time since ``start_step`` (or since the first section, when
        ``start_step`` was not called).
        """
        totals = {"data_time": 0.0, "compute_time": 0.0, "comm_time": 0.0}
        if not self._spans and self._step_start is None:
            return {"step_time": 0.0, **totals}
        if self.uses_events:
            end = self._mark()
            end.synchronize()
            for name, start, stop in self._spans:
                totals[name + "_time"] += start.elapsed_time(stop) / 1000.0
            first = self._step_start if self._step_start is not None else self._spans[0][1]
            step_time = first.elapsed_time(end) / 1000.0
        else:
            now = self._clock()
            for name, start, stop in self._spans:
                totals[name + "_time"] += stop - start
            first = self._step_start if self._step_start is not None else self._spans[0][1]
            step_time = now - first
        self._spans.clear()
        self._step_start = None
        if self.run is not None:
            self.run.set_phase("other")
        return {"step_time": step_time, **totals}
