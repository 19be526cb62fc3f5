"""The typed messages of the pipeline: ingest → monitor → alerting → outbox.

Each stage runs on its own thread and is fed through a queue; what travels on a queue is one of
these (or a store result, :mod:`healthsvc.store.results`), never a tuple tagged by a string::

    store writer ──IngestResult, RunEvent──▶ monitor hub ──findings job──▶ store writer
        (the hub folds the findings into alerts, notifications and outbox rows before the job,
        with a corruption page's rollback target; the job writes all of it: one transaction)
    monitor hub, the run's owner, also does the rest of its runs' alerts: a Tick ticks them
        (group intervals, resolve timeouts), a rollback event resolves latched ones: one job each
    ticker ──Tick──▶ every stage;   tests, shutdown ──Drain, Stop──▶ every stage
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


@dataclass(frozen=True)
class Tick:
    """A ticker's beat: do what is due at ``now`` (service clock, unix seconds). ``asked``: a
    drain asked for it (tests): what runs on an interval of its own (alerting's ticks) is done
    now too, not only when its interval elapsed."""
    now: float
    asked: bool = False


@dataclass(frozen=True)
class Drain:
    """A barrier: ``done`` is set once everything queued before it has been processed (and, with
    ``tick``, once the stage did what is due at its clock's time now)."""
    done: threading.Event = field(default_factory=threading.Event)
    tick: bool = False


@dataclass(frozen=True)
class Stop:
    """End the stage's thread once what was queued before it is processed."""


@dataclass(frozen=True)
class Flush:
    """Hand on a run's pending steps now (the run finished: nothing more will complete them)."""
    run_id: str


@dataclass(frozen=True)
class RunOwned:
    """With replicas: this replica took the run over (``gained``), or let it go (its lease ran
    out or another replica took it). The lease layer tells the monitor hub; the hub tells
    alerting."""
    run_id: str
    gained: bool


def handle_in_order(items: Iterable[Any], handle: Callable[[Any], None], log: logging.Logger, stage: str) -> bool:
    """A stage's queued items, in order: a :class:`Drain` is released, a :class:`Stop` ends the
    stage (False), anything else goes to ``handle``, whose failure is logged, not raised (one bad
    input must not stop the stage)."""
    for item in items:
        if isinstance(item, Stop):
            return False
        if isinstance(item, Drain):
            item.done.set()
            continue
        try:
            handle(item)
        except Exception:
            log.exception("%s failed on %r", stage, type(item).__name__)
    return True
