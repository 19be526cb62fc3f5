"""A replica hears other replicas' token changes: ``LISTEN`` on the tokens channel, a callback
per burst of notifications.

A creation or revocation commits with a ``NOTIFY`` (:mod:`healthsvc.store.tokens`); PostgreSQL
delivers it to every listening connection within milliseconds, and ``on_change`` (the token
cache's reload) runs on this thread. While the connection is down nothing is heard, so
``on_change`` also runs each time ``LISTEN`` is (re)established: what changed meanwhile is read
then. Notifications that arrive together cost one call.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from healthsvc.store.tokens import CHANNEL

log = logging.getLogger(__name__)

RETRY_S = 0.5      # between attempts to reconnect (also how often a stop is noticed)


class TokenWatch:
    def __init__(self, connect: Callable[[], Any], on_change: Callable[[], None]) -> None:
        self._connect = connect
        self._on_change = on_change
        self._stopping = threading.Event()
        self.listening = threading.Event()     # set while LISTEN is in place
        self._thread = threading.Thread(target=self._loop, name="healthsvc-token-watch", daemon=True)

    def __repr__(self) -> str:
        return f"TokenWatch(listening={self.listening.is_set()})"

    def start(self) -> "TokenWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(RETRY_S * 4)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn = self._connect()
                try:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    self._on_change()   # whatever changed while nobody listened
                    while not self._stopping.is_set():
                        # The reload reads what every note delivered so far announced; notes
                        # arriving during it cost one more reload, never a missed change.
                        if list(conn.notifies(timeout=RETRY_S, stop_after=1)):
                            self._on_change()
                finally:
                    self.listening.clear()
                    conn.close()
            except Exception:   # the connection, or a reload's read: listen again, and reload then
                if not self._stopping.wait(RETRY_S):
                    log.warning("tokens: the change listener failed; listening again", exc_info=True)
