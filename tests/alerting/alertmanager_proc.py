"""A real Prometheus Alertmanager (Debian's ``prometheus-alertmanager``, installed by ``./dev test``)
on 127.0.0.1, routing every alert to one webhook receiver, for the ``alertmanager_api`` tests.

Clustering is off (``--cluster.listen-address=``), so nothing listens beyond the one HTTP port.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.barriers import answers_ok, wait_until
from tests.server_process import free_port

BINARY = "prometheus-alertmanager"

CONFIG = """\
global:
  resolve_timeout: {resolve_timeout}
route:
  receiver: hook
  group_by: ['alertname', 'run']
  group_wait: 100ms
  group_interval: 500ms
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {webhook_url}
        send_resolved: true
"""


class AlertmanagerProcess:
    def __init__(self, workdir: Path, webhook_url: str, resolve_timeout: str = "2s") -> None:
        binary = shutil.which(BINARY)
        if binary is None:  # never skipped: ./dev test installs it (apt-get install prometheus-alertmanager)
            raise RuntimeError(f"{BINARY} is not installed; run the tests with ./dev test, which installs it")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "alertmanager.yml").write_text(CONFIG.format(resolve_timeout=resolve_timeout,
                                                                webhook_url=webhook_url))
        self.log_path = workdir / "alertmanager.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "AlertmanagerProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.workdir / 'alertmanager.yml'}",
             f"--storage.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--cluster.listen-address=", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"alertmanager exited: {self.log_path.read_text()[-2000:]}")
            return answers_ok(self.url + "/-/ready")
        wait_until(ready, timeout_s=30, interval_s=0.05, what=f"alertmanager to be ready (see {self.log_path})")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
