"""The heartbeat: a thread that posts ``{rank, step, phase}`` every ``heartbeat_interval_s``, even
while the training thread is stuck, and the ``phase`` context manager that says where it is stuck.

Heartbeats go straight to the service, never through the relay: they are how the service tells a
silent rank from a dead one, so they must not depend on a second process staying alive.
"""
from __future__ import annotations

import threading
from typing import Any, Protocol, TYPE_CHECKING

from healthsvc_client import encode
from healthsvc_client.transport import Request, Transport


class Phase:
    """Context manager returned by ``Run.phase``; a class, not a generator, to stay cheap."""

    __slots__ = ("_run", "_name", "_step", "_previous")

    def __init__(self, run: Any, name: str, step: int | None) -> None:
        self._run, self._name, self._step = run, name, step
        self._previous = "other"

    def __enter__(self) -> Phase:
        self._previous = self._run._phase
        self._run._phase = self._name
        if self._step is not None:
            self._run._step_in_progress = self._step
        return self

    def __exit__(self, *exc: object) -> None:
        self._run._phase = self._previous



class _HeartbeatCounters(Protocol):
    heartbeats_sent: int
    heartbeats_failed: int


class Heartbeat:
    """Mixin of :class:`healthsvc_client.client.Run`: the heartbeat thread's loop."""

    # The run's state the loop reads (set by Run), declared for the type checker.
    rank: int
    timeout_s: float
    heartbeat_interval_s: float
    _base_path: str
    _phase: str
    _hb_stop: threading.Event
    _transport: Transport | None
    _counters: _HeartbeatCounters

    if TYPE_CHECKING:
        @property
        def step_in_progress(self) -> int: ...

        def _problem(self, key: str, message: str) -> None: ...

    def _heartbeat_main(self) -> None:
        suffix = self._base_path + "/heartbeats"
        while not self._hb_stop.is_set():
            body = {"rank": self.rank, "step": self.step_in_progress, "phase": self._phase}
            request = Request("POST", suffix, encode.encode_json(body),
                              {"Content-Type": "application/json"})
            try:
                # One attempt: a late heartbeat is worthless, the next one is due soon.
                response = self._transport.request(  # type: ignore[union-attr]
                    request, min(self.timeout_s, self.heartbeat_interval_s))
                ok = 200 <= response.status < 300
            except Exception as exc:
                self._problem("heartbeat", f"heartbeat failed: {exc!r}")
                ok = False
            if ok:
                self._counters.heartbeats_sent += 1
            else:
                self._counters.heartbeats_failed += 1
            self._hb_stop.wait(self.heartbeat_interval_s)
