"""A local healthsvc in a subprocess (``python -m healthsvc serve`` on 127.0.0.1, a free port).

    with LocalServer(db_path) as server:
        httpx.get(server.url + "/v1/runs")

Shipped (not a test helper) because :func:`healthsvc.replay.connect_or_serve` starts one for a
notebook that has no service to read from, and ``examples/record_run.py`` records a run through
one. The tests' server (``tests/server_process.py``) builds on it and adds what only tests and
benchmarks need. ``stop()`` sends SIGTERM (a clean shutdown), ``kill()`` SIGKILL; ``start()``
starts it again on the same database file.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A loopback port free now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    def __init__(self, db_path: str | os.PathLike, *, port: int | None = None, env: dict[str, str] | None = None,
                 log_path: str | os.PathLike | None = None, extra_args: list[str] | None = None) -> None:
        self.db_path = str(db_path)
        self.port = port or free_port()
        self.env = env or {}
        self.log_path = str(log_path) if log_path else str(Path(self.db_path).with_suffix(".server.log"))
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, pid={self.pid})"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout_s: float = 30.0) -> "LocalServer":
        env = {**os.environ, **self.env}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "healthsvc", "serve", "--db", self.db_path, "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning", *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log_path}:\n"
                                   + Path(self.log_path).read_text()[-3000:])
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"server not ready within {timeout_s}s; see {self.log_path}")

    def kill(self) -> None:
        """SIGKILL: the process dies mid-flight, as in a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM: a clean shutdown."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
