"""The service's drain barrier: return once everything already caused has been processed.

Work crosses several threads on its way through the service (see ``app.py``): a request's write
is a job of the store's writer; its after-commit listeners queue it for the monitor (detectors)
and the dashboard's rollups; the job that stores the monitor's findings also folds them into
alerts and notifications (one transaction); alerting's thread then does what waits for the commit
(a corruption alert's rollback target), ticks and rollbacks; the delivery worker sends. :func:`drain` waits for each stage
in that order, so when it returns every finding, alert, notification and webhook attempt caused
by what came before the call is stored (webhook retries scheduled for later excepted: they fall
due when the clock gets there).

With ``tick=True`` the time-driven checks (hang and stall timeouts, aligner waits, alert group
intervals and resolve timeouts) also run once at the clock's time now: a test that drives the
service with a fake clock advances it, then drains with ``tick=True``, instead of sleeping.

This is the only place that knows the pipeline's stages and their order: whoever waits for the
whole service (``tests/harness.py``, tools) calls this function, not the stages' own barriers
(``drain()`` of the monitor, the rollups, alerting and the delivery worker), which only a test of
that one stage uses. When the pipeline changes shape, this function changes with it.
"""
from __future__ import annotations

import time
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any


class DrainTimeout(AssertionError):
    """A stage did not finish its queued work in time (it is stuck, or far behind)."""


def drain(app: Any, *, tick: bool = False, timeout_s: float = 30.0) -> None:
    """Block until the service behind ``app`` (a FastAPI app from ``create_app``) is idle."""
    deadline = time.monotonic() + timeout_s
    state = app.state
    store = state.store
    monitor = getattr(state, "monitor", None)
    dashboard = getattr(state, "dashboard", None)
    alerting = getattr(state, "alerting", None)

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    def check(done: bool, stage: str) -> None:
        if not done:
            raise DrainTimeout(f"drain: the {stage} did not finish its queued work within {timeout_s} s")

    def writer() -> None:
        # Two empty jobs: the second runs in a later group than the first, so the after-commit
        # listeners of every group before it (which queue work for the next stages) have run.
        for _ in range(2):
            try:
                store.barrier().result(left())
            except FuturesTimeout:
                check(False, "store's writer")

    writer()
    for hub, name in ((monitor, "monitor"), (dashboard, "dashboard rollups")):
        if hub is not None:
            if tick:
                hub.tick()
            check(hub.drain(left()), name)
    writer()   # the findings the monitor recorded, with their alerts, and their listeners
    if alerting is not None and alerting.manager is not None:
        check(alerting.drain(left(), tick=tick), "alerting thread")
        writer()
        if alerting.worker is not None:
            check(alerting.worker.drain(left()), "webhook delivery worker")
            writer()
