"""A TCP proxy the test can freeze: between one replica and PostgreSQL, a network that stops
carrying anything without closing a connection (a partition, a hung switch).

    with FreezableProxy(5432) as proxy:       # connect to 127.0.0.1:proxy.port
        proxy.freeze(); ...; proxy.thaw()

Frozen, bytes read from either side are held (nothing is forwarded, nothing closed) and new
connections are accepted but not carried; thawed, what was held goes on in order, as a network
that comes back delivers what it had queued.
"""
from __future__ import annotations

import socket
import threading


class FreezableProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._accepter = threading.Thread(target=self._accept, daemon=True, name="proxy-accept")

    def __repr__(self) -> str:
        return f"FreezableProxy(port={self.port}, frozen={not self._flowing.is_set()})"

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        self._flowing.wait()          # a connection opened while frozen goes nowhere until the thaw
        if self._closed.is_set():
            client.close()
            return
        try:
            server = socket.create_connection(self.upstream, timeout=5)
            server.settimeout(None)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, server]
        for src, dst in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()  # frozen: hold what was read
                if self._closed.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> "FreezableProxy":
        self._accepter.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                s.close()
        self._accepter.join(5)
