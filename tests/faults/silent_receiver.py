"""A webhook address that accepts TCP connections and never answers: the receiver that hangs.

Its connections stay open (nothing is read, nothing written) until the test closes it, so a
sender's only way out is its own timeout.
"""
from __future__ import annotations

import socket
import threading


class SilentReceiver:
    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:      # closed: the test is over
                return
            self.accepted.append(conn)

    def __enter__(self) -> "SilentReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._sock.close()
        for conn in self.accepted:
            conn.close()
        self._thread.join(5)
