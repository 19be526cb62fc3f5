"""The real healthsvc server in a subprocess, for tests and benchmarks.

    with ServerProcess(db_path) as server:
        httpx.get(server.url + "/v1/runs")

It is :class:`healthsvc.local_server.LocalServer` (``python -m healthsvc serve`` under uvicorn on
127.0.0.1, a free port; the shipped replay tools need it too) plus ``cpu_seconds()``, which only
benchmarks use; its ``kill()`` (SIGKILL mid-flight) is the tests' crash. Tests about service
logic run the app in process instead (``tests/harness.py``: a fake clock and a drain barrier);
this one is for crashes, the CLI and whole-process behaviour.
"""
from __future__ import annotations

import os

from healthsvc.local_server import LocalServer, free_port

__all__ = ["ServerProcess", "free_port"]


class ServerProcess(LocalServer):
    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far, from /proc."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks
