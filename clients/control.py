"""The run's requests other than metrics: checkpoints, events and user alerts (queued, sent by the
sender thread after the records logged before them) and the rollback question (asked on the
calling thread). A mixin of :class:`healthsvc_client.client.Run`.

Like heartbeats, these go straight to the service, never through the relay: they are rare, and a
finish or checkpoint must follow this rank's own records logged before it and come before those
logged after it, which the sender guarantees (each control request carries its place among the
records: see ``healthsvc_client.sender``). The service relies on the second half: once a rank
has stored a record past a step, the checkpoints it registered before that step are stored
(``healthsvc.supervise.service.settle``).
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Protocol, TYPE_CHECKING

from healthsvc_client.queue import DropOldestQueue
from healthsvc_client.transport import Request, Transport
from healthsvc_client.wire import EVENT_KINDS


class _ControlCounters(Protocol):
    ignored_calls: int


class Control:
    """Mixin of :class:`healthsvc_client.client.Run`: checkpoint, event, alert, rollback_target."""

    # The run's state these read (set by Run), declared for the type checker.
    rank: int
    timeout_s: float
    _base_path: str
    _off: bool
    _transport: Transport | None
    _rows: DropOldestQueue[tuple[int, float, dict]]
    _cols: DropOldestQueue[tuple[int, float, dict]]
    _control: DropOldestQueue[tuple[str, str, Any, tuple[int, int]]]
    _wake: threading.Event
    _counters: _ControlCounters

    if TYPE_CHECKING:
        def _problem(self, key: str, message: str) -> None: ...

    def checkpoint(self, step: int, uri: str, duration_s: float | None = None,
                   bytes: int | None = None) -> None:  # noqa: A002 - the wire field is "bytes"
        """Register a checkpoint holding the state after the update of ``step``."""
        body: dict[str, Any] = {"step": step, "uri": uri}
        if duration_s is not None:
            body["duration_s"] = duration_s
        if bytes is not None:
            body["bytes"] = bytes
        self._enqueue_control("POST", "/checkpoints", body)

    def event(self, kind: str, step: int | None = None, **data: Any) -> None:
        """Record a run event (restart, world_size_change, rollback, config_change, note)."""
        if kind not in EVENT_KINDS:
            self._problem("event", f"unknown event kind {kind!r}; expected one of {EVENT_KINDS}")
        # The rank and the trainer's clock go inside ``data``: the event body is {kind, step, data}.
        body = {"kind": kind, "step": step, "data": {**data, "rank": self.rank, "ts": time.time()}}
        self._enqueue_control("POST", "/events", body)

    def alert(self, message: str, severity: str = "warning", step: int | None = None,
              **data: Any) -> None:
        """A user-raised alert: an event of kind ``note`` with a severity (info, warning, critical)."""
        self.event("note", step=step, message=message, severity=severity, **data)

    def _enqueue_control(self, method: str, suffix: str, body: Any) -> None:
        if self._off:
            self._counters.ignored_calls += 1
            return
        # Where it stands among the records: the rows and column blocks logged before it go out
        # before it, those logged after it after it (the sender's order).
        self._control.put((method, suffix, body, (self._rows.puts, self._cols.puts)))
        self._wake.set()

    # ---- lifecycle ----------------------------------------------------------------------------
    def rollback_target(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """``GET /v1/runs/{run_id}/rollback`` on the calling thread: where to resume from.

        Returns the service's answer (``{"checkpoint": {"step", "uri"} | None, "onset": ..., "reason": ...}``)
        or None when offline, disabled, or the service cannot be reached. Never raises.
        """
        if self._transport is None:
            return None
        try:
            resp = self._transport.request(
                Request("GET", self._base_path + "/rollback", b"", {"Accept": "application/json"}),
                self.timeout_s if timeout_s is None else timeout_s)
            if resp.status != 200:
                self._problem("rollback", f"GET rollback answered {resp.status}: {resp.body[:200]!r}")
                return None
            answer = json.loads(resp.body)
            return answer if isinstance(answer, dict) else None
        except Exception as exc:
            self._problem("rollback", f"GET rollback failed: {exc!r}")
            return None
