"""The pipeline, built in one place: what a commit of the store's writer feeds, stage by stage.

    request ──▶ writer job 1: ingest ──commit──▶ each stage below, in order, is fed what it stored

Every stage is a :class:`Stage`: what it takes from a group commit's results (on the writer
thread: it queues, it never waits) and how to wait until it has done what it was fed. The list
in :func:`build` is the pipeline's order; :meth:`Pipeline.drain` (the tests' barrier,
``healthsvc.drain.drain``) is derived from it: each stage in turn, then the writer, so that
when it returns everything already caused is stored. A new stage goes into :func:`build`,
nowhere else. Writer jobs 2 and 3 of a page (findings with their alerts, notifications and
outbox rows, folded by the monitor before the job; a delivery pass) are the monitor's and the
delivery worker's (docs/architecture.md).
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from healthsvc.findings import FindingsRecorded

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext
    from healthsvc.store.interface import Store

log = logging.getLogger(__name__)


class DrainTimeout(AssertionError):
    """A stage did not finish its queued work in time (it is stuck, or far behind)."""


@dataclass(frozen=True)
class Stage:
    """One stage. ``committed(results)``: after each group commit, on the writer thread (queue
    only). ``drain(timeout_s, tick)``: wait until what it was fed is done (with ``tick``, after
    doing what is due at the clock's time now: hang and stall timeouts, group intervals); False
    if that took longer than ``timeout_s``."""
    name: str
    committed: Callable[[list[Any]], None] | None = None
    drain: Callable[[float, bool], bool] | None = None


def build(ctx: ServiceContext) -> Pipeline:
    """The stages, in order (those of features not installed left out)."""
    monitor, dashboard, alerting = ctx.monitor, ctx.dashboard, ctx.alerting
    # The monitor's tick, asked by a drain, also ticks its runs' alerts whatever their interval.
    ticked_monitor = _ticked(lambda: monitor.tick(asked=True), monitor) if monitor else None
    stages = [
        # The findings a job stored: the replay probes they ask for.
        Stage("replay probes", committed=_findings_only(ctx.auto_probe)) if ctx.auto_probe else None,
        # The runs' detectors, on the run's owner: writer job 2 (findings with the alerts,
        # notifications and outbox rows the owner folded them into before the job, a page's
        # rollback target looked up then; the page handed to the delivery worker once it is
        # durable). The owner also ticks its runs' alerts and hands them rollbacks.
        Stage("monitor", committed=monitor.committed, drain=ticked_monitor) if monitor else None,
        Stage("dashboard rollups", committed=dashboard.committed, drain=_ticked(dashboard.tick, dashboard))
        if dashboard else None,
        Stage("run metrics", committed=ctx.run_series.committed) if ctx.run_series else None,
        # Sends; writer job 3, one per pass: record the finished attempts, pull forward, claim.
        Stage("webhook delivery worker",
              drain=lambda timeout_s, tick: alerting.worker is None or alerting.worker.drain(timeout_s)),
    ]
    return Pipeline(ctx.store, [s for s in stages if s is not None])


class Pipeline:
    def __init__(self, store: Store, stages: list[Stage]) -> None:
        self.store = store
        self.stages = stages
        store.subscribe(self._committed)   # the store's one after-commit listener

    def _committed(self, results: list[Any]) -> None:
        for stage in self.stages:
            if stage.committed is not None:
                try:
                    stage.committed(results)
                except Exception:  # one stage must never keep the others from their input
                    log.exception("pipeline stage %s failed on a commit's results", stage.name)

    def drain(self, *, tick: bool = False, timeout_s: float = 30.0) -> None:
        """Block until every stage is idle, in order (:class:`DrainTimeout` names the one that
        was not within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        def writer() -> None:
            # Two empty jobs: the second runs in a later group than the first, so the after-commit
            # listeners of every group before it (which feed the next stages) have run.
            for _ in range(2):
                try:
                    self.store.barrier().result(left())
                except FuturesTimeout:
                    raise DrainTimeout(f"drain: the store's writer did not finish its queued work within {timeout_s} s")

        writer()
        for stage in self.stages:
            if stage.drain is None:
                continue
            if not stage.drain(left(), tick):
                raise DrainTimeout(f"drain: the {stage.name} did not finish its queued work within {timeout_s} s")
            writer()   # what the stage wrote, and the listeners of its commits


def _ticked(tick_now: Callable[[], None], hub: Any) -> Callable[[float, bool], bool]:
    """A hub's drain, after queueing its tick when asked (a hub ticks by a message on its queue)."""
    def drain(timeout_s: float, tick: bool) -> bool:
        if tick:
            tick_now()
        return bool(hub.drain(timeout_s))
    return drain


def _findings_only(listener: Callable[[list], None]) -> Callable[[list[Any]], None]:
    def committed(results: list[Any]) -> None:
        for res in results:
            if isinstance(res, FindingsRecorded) and res.findings:
                listener(res.findings)
    return committed
