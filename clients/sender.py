"""The sender thread of a ``Run``: drains the queues every ``flush_interval_s`` (at once when asked,
or when a float value is NaN/Inf), merges several ``log()`` calls of one step into one record, and
posts rows, column blocks and control requests in the order they were queued (a control request
after the records logged before it, before those logged after it).

A mixin of :class:`healthsvc_client.client.Run` (the state it reads is the run's: its queues, the flush
generation counters, ``_held``); one request goes out through the run's
:class:`healthsvc_client.delivery.Delivery`; metrics rows through the per-host relay when the run has one
(:class:`healthsvc_client.relay_link.RelayLink`).
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Protocol, TYPE_CHECKING

from healthsvc_client import encode
from healthsvc_client.delivery import Delivery
from healthsvc_client.queue import DropOldestQueue
from healthsvc_client.relay_link import RelayLink
from healthsvc_client.wire import INCARNATION_FIELD


class _SenderCounters(Protocol):
    invalid_fields: int


class Sender:
    """The sender thread's loop and the bodies it builds (see the module docstring)."""

    # The run's state the loop reads and writes (set by Run), declared for the type checker.
    rank: int
    host: str
    world_size: int | None
    flush_interval_s: float
    max_batch: int
    _base_path: str
    _rows: DropOldestQueue[tuple[int, float, dict]]
    _cols: DropOldestQueue[tuple[int, float, dict]]
    _control: DropOldestQueue[tuple[str, str, Any, tuple[int, int]]]
    _held: tuple[int, float, dict] | None
    _wake: threading.Event
    _closing: threading.Event
    _cond: threading.Condition
    _flush_requested: int
    _flush_done: int
    _delivery: Delivery | None     # None only in a forked child, which runs no sender thread
    _relay: RelayLink | None
    _counters: _SenderCounters

    if TYPE_CHECKING:
        def _problem(self, key: str, message: str) -> None: ...

        def _pending(self) -> int: ...

    def _sender_main(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            with self._cond:
                generation = self._flush_requested
                force = generation > self._flush_done or self._closing.is_set()
            try:
                self._send_pending(force)
            except Exception as exc:  # a bug here must not kill delivery for the rest of the run
                self._problem("sender", f"sender error: {exc!r}")
            with self._cond:
                self._flush_done = max(self._flush_done, generation)
                self._cond.notify_all()
            if self._closing.is_set() and self._pending() == 0:
                return

    def _live_delivery(self) -> Delivery:
        delivery = self._delivery
        assert delivery is not None   # None only in a forked child, which runs no sender thread
        return delivery

    def _send_pending(self, force: bool) -> None:
        """Everything queued, in the order it was queued: each control request after the rows
        and column blocks logged before it, before those logged after it. (Sending every record
        drained first and the controls after them let a checkpoint of step c follow records of
        steps well past c, and the service decide, on a record past c, before the checkpoint
        was in: ``healthsvc.supervise.service.settle``.)"""
        while True:
            head = self._control.peek()
            rows_mark, cols_mark = (None, None) if head is None else head[3]
            self._send_queued_rows(force, rows_mark)
            self._send_queued_columns(cols_mark)
            if head is None:
                return
            [(method, suffix, body, _)] = self._control.drain(1)
            if self._held is not None:
                # Held back by an earlier pass (logged before this control): it must not be
                # overtaken (records after a finish re-open the run).
                held, self._held = self._held, None
                self._send_rows([held])
            self._live_delivery().deliver(method, self._base_path + suffix, body, n_records=0)

    def _send_queued_rows(self, force: bool, mark: int | None) -> None:
        """The queued rows, or (``mark``) those put before the ``mark``-th put."""
        while True:
            limit = self.max_batch
            if mark is not None:
                limit = min(limit, mark - (self._rows.taken + self._rows.dropped))
            rows = self._rows.drain(limit) if limit > 0 else []
            if self._held is not None and (rows or mark is None):
                rows.insert(0, self._held)
                self._held = None
            if not rows:
                return
            # One body per incarnation: the records before an in-process rollback and those after
            # it are two attempts' (and a step of each must not be merged into one record).
            runs = encode.runs_of(rows, lambda row: row[2].get(INCARNATION_FIELD))
            for i, run_rows in enumerate(runs):
                merged = encode.merge_by_step(run_rows)
                # Never hold a record back while a checkpoint/event/finish waits: it must not
                # overtake the records logged before it (a finish followed by records re-opens
                # the run).
                if (i == len(runs) - 1 and mark is None and not force and not len(self._rows)
                        and not len(self._control) and self._may_still_grow(merged)):
                    self._held = merged.pop()
                if merged:
                    self._send_rows(merged)
            if not len(self._rows):
                return

    def _send_queued_columns(self, mark: int | None) -> None:
        """The queued column blocks, or (``mark``) those put before the ``mark``-th put."""
        while True:
            limit = self.max_batch
            if mark is not None:
                limit = min(limit, mark - (self._cols.taken + self._cols.dropped))
            blocks = self._cols.drain(limit) if limit > 0 else []
            if not blocks:
                return
            for run_blocks in encode.runs_of(blocks, lambda block: block[2].get(INCARNATION_FIELD)):
                self._send_columns(run_blocks)

    def _may_still_grow(self, merged: list[tuple[int, float, dict]]) -> bool:
        """Hold back the newest step's record for one more interval when the training thread may
        still add fields to it (``log(loss=..)`` then ``log(grad_norm=..)``): the service reads a
        step a rank already reported as a restart, so one step must not straddle two batches.
        Never held: a record with a non-finite float (that is flushed now) or one older than the
        flush interval (a rank stuck after logging it)."""
        step, ts, metrics = merged[-1]
        if any(other[0] > step for other in merged):
            return False
        if any(v.__class__ is float and (v - v) != 0.0 for v in metrics.values()):
            return False
        return time.time() - ts < self.flush_interval_s

    def _send_rows(self, merged: list[tuple[int, float, dict]]) -> None:
        rank, host, world_size = self.rank, self.host, self.world_size
        records = []
        for step, ts, metrics in merged:
            record: dict[str, Any] = {"step": step, "rank": rank}
            for name, value in metrics.items():
                if value.__class__ in _JSON_SCALARS:
                    record[name] = value
                else:  # numpy scalars, tensors: converted here, off the training thread
                    try:
                        record[name] = encode.to_scalar(value)
                    except (TypeError, ValueError, RuntimeError):
                        self._counters.invalid_fields += 1
                        self._problem("invalid_field", f"dropped non-numeric field {name!r} at step {step}")
            if "ts" not in record:
                record["ts"] = ts
            if "host" not in record:
                record["host"] = host
            if world_size is not None and "world_size" not in record:
                record["world_size"] = world_size
            records.append(record)
        body = {"batch_id": uuid.uuid4().hex, "records": records}
        # A NaN/Inf goes straight to the service, not through the relay: the relay would hold it
        # until the batch before it is done and then until its gather window; a page must not wait.
        if self._relay is not None and not any(
                v.__class__ is float and (v - v) != 0.0 for r in records for v in r.values()):
            # Urgent (the relay posts at once): a flush() or the close is waiting.
            urgent = self._flush_requested > self._flush_done or self._closing.is_set()
            self._relay.deliver(self._base_path + "/metrics", body, len(records), urgent)
        else:
            self._live_delivery().deliver("POST", self._base_path + "/metrics", body, n_records=len(records))

    def _send_columns(self, blocks: list[tuple[int, float, dict]]) -> None:
        converted = []
        for step, ts, block in blocks:
            cols = {name: _to_list(values) for name, values in block.items() if name != INCARNATION_FIELD}
            n = len(cols["rank"])
            if INCARNATION_FIELD in block:
                cols[INCARNATION_FIELD] = [block[INCARNATION_FIELD]] * n
            if "step" not in cols:
                cols["step"] = [step] * n
            cols.setdefault("ts", [ts] * n)
            converted.append(cols)
        columns = encode.concat_columns(converted)
        body = {"batch_id": uuid.uuid4().hex, "columns": columns}
        self._live_delivery().deliver("POST", self._base_path + "/metrics", body, n_records=len(columns["rank"]))



_JSON_SCALARS = frozenset({float, int, str, bool, type(None)})


def _to_list(values: Any) -> list:
    """A column as a list of JSON scalars (numpy arrays and tensors via ``tolist``)."""
    tolist = getattr(values, "tolist", None)
    if tolist is not None:
        detach = getattr(values, "detach", None)
        items = (detach().cpu() if detach is not None else values).tolist()
    else:
        items = list(values)
    return [v if v.__class__ in (int, float, str, bool) or v is None else encode.to_scalar(v)
            for v in items]
