"""Run a real healthsvc server in a subprocess: for tests, benchmarks and notebooks.

    with ServerProcess(db_path) as server:
        httpx.get(server.url + "/v1/runs")

The server is the real thing (``python -m healthsvc serve`` under uvicorn on 127.0.0.1); only its
port is picked free. ``kill()`` sends SIGKILL (a crash), ``stop()`` SIGTERM (a clean shutdown),
``start()`` starts it again on the same database file.
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, db_path: str | os.PathLike, *, port: int | None = None, env: dict[str, str] | None = None,
                 log_path: str | os.PathLike | None = None, extra_args: list[str] | None = None) -> None:
        self.db_path = str(db_path)
        self.port = port or free_port()
        self.env = env or {}
        self.log_path = str(log_path) if log_path else str(Path(self.db_path).with_suffix(".server.log"))
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return f"ServerProcess(url={self.url!r}, pid={self.pid})"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout_s: float = 30.0) -> "ServerProcess":
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

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far, from /proc."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
