"""Committed pushes taken from a stage's queue together and fed to a run in one go.

A busy service commits pushes faster than one at a time: when the monitor's (or the dashboard's)
thread wakes, its queue often holds several pushes of the same run, each a rank's record or a
host's few. Feeding them one by one costs the detectors' and the aligner's fixed cost per call
(numpy on arrays of one element) for every push; fed as one batch it is paid once, and the
findings are the same: every detector judges records by their step and rank, the aligner joins a
step's ranks whichever push brought them, and a (step, rank) repeated keeps the later record in
both ways. The one difference is for the better: the non-finite check judges each batch as it
arrives, so a NaN gradient norm that every rank reports names its origin rank at once when the
origin's record comes in the same batch, where the ranks' pushes judged one by one first raise it
run-wide (``tests/service/test_coalesce.py``). The dashboard's rollups are fed the same way:
one by one, they cost a 1-record push about as much as its parse.

:func:`take` empties a queue without waiting beyond the first item; :func:`group_pushes` merges
its pushes per run. Anything else on the queue (an event, a tick, a barrier) is a fence: no push
crosses it, so every run still sees its inputs in the order they were committed.
"""
from __future__ import annotations

import queue
from typing import Any

from healthsvc.store.batch import MetricBatch
from healthsvc.store.results import IngestResult

TAKE_AT_MOST = 256   # queued items handled together; bounds a merged batch's size and latency


def take(q: "queue.Queue[Any]", at_most: int = TAKE_AT_MOST) -> list[Any]:
    """The next item (waiting for it) and whatever else is queued already, up to ``at_most``."""
    items = [q.get()]
    try:
        while len(items) < at_most:
            items.append(q.get_nowait())
    except queue.Empty:
        pass
    return items


def unpacked(items: list[Any]) -> list[Any]:
    """A queue's items with each list spread out, in order: the writer thread hands a stage the
    results of one group commit as one list (one queue put, one wake-up, not one per push)."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, list):
            out.extend(item)
        else:
            out.append(item)
    return out


def group_pushes(items: list[Any]) -> list[Any]:
    """``items`` in order, except that the pushes (IngestResults) between two other items come as
    lists, one per run and attempt, each in commit order. A run's pushes of two attempts (a
    restart, or records of an earlier attempt delivered late) are separate lists, in order."""
    out: list[Any] = []
    open_groups: dict[str, list[IngestResult]] = {}
    for item in items:
        if not isinstance(item, IngestResult):
            open_groups.clear()
            out.append(item)
            continue
        group = open_groups.get(item.run_id)
        if group is None or group[-1].attempt != item.attempt:
            group = open_groups[item.run_id] = []
            out.append(group)
        group.append(item)
    return out


def merged(pushes: list[IngestResult], without: frozenset[str] = frozenset()) -> IngestResult:
    """One result for a run's consecutive pushes of one attempt: their records in commit order
    (but the string fields named in ``without``), the newest chunk id, receive time and run state
    (what the last commit left)."""
    if len(pushes) == 1:
        return pushes[0]
    last = pushes[-1]
    chunk_ids = [p.chunk_id for p in pushes if p.chunk_id is not None]
    batches: list[MetricBatch] = []
    for p in pushes:
        assert p.batch is not None   # the hubs queue only pushes that committed records
        batches.append(p.batch)
    return IngestResult(
        last.run_id, sum(p.accepted for p in pushes), False, last.attempt,
        any(p.new_attempt for p in pushes), max(chunk_ids) if chunk_ids else None, last.received_at,
        MetricBatch.concat(batches, without), last.run)
