"""nginx (Debian's package) in front of the test's replicas, from the shipped configuration
``examples/scale_out/nginx.conf`` with the test's ports in place of 8080..8083.

``access_log=True`` turns on an access log of each request's path and the replica(s) nginx sent
it to (``$upstream_addr``: a comma list when a replica refused and the next one took it), read
back with :meth:`Balancer.routed`. ``round_robin=True`` takes the shipped run hash out (the
benches' comparison: nginx's default balancing)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.barriers import answers_ok, wait_until

CONF = Path(__file__).resolve().parents[2] / "examples" / "scale_out" / "nginx.conf"


class Balancer:
    def __init__(self, prefix: Path, port: int, upstreams: list[int], access_log: bool = False,
                 round_robin: bool = False) -> None:
        self.prefix, self.port, self.upstreams, self.access_log = Path(prefix), port, upstreams, access_log
        self.round_robin = round_robin
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        text = CONF.read_text()
        servers = [m.group(0) for m in re.finditer(r"^\s*server 127\.0\.0\.1:808[1-9].*$", text, re.M)]
        assert len(servers) == 3, "the shipped config names three replicas"
        lines = [servers[0].replace(servers[0].split()[1], f"127.0.0.1:{p}") for p in self.upstreams]
        text = text.replace("\n".join(servers), "\n".join(lines))
        text = text.replace("listen 127.0.0.1:8080;", f"listen 127.0.0.1:{self.port};")
        if self.round_robin:
            assert "hash $run_key consistent;" in text, "the shipped config hashes on the run"
            text = text.replace("hash $run_key consistent;", "")
        if self.access_log:
            text = text.replace("access_log off;", "log_format routed '$uri $upstream_addr';\n"
                                                   "    access_log access.log routed;")
        if os.geteuid() == 0:  # nginx started by root drops its workers to nobody otherwise
            text = "user root;\n" + text
        return text

    def start(self) -> "Balancer":
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        (self.prefix / "tmp").mkdir(parents=True, exist_ok=True)
        conf = self.prefix / "nginx.conf"
        conf.write_text(self.config())
        self.proc = subprocess.Popen([nginx, "-p", str(self.prefix), "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=open(self.prefix / "stderr.log", "wb"))
        wait_until(lambda: self.proc.poll() is not None or answers_ok(self.url + "/healthz"), 10, "nginx up")
        assert self.proc.poll() is None, (self.prefix / "stderr.log").read_text()
        return self

    def routed(self) -> list[tuple[str, list[int]]]:
        """(path, ports nginx tried in order) of each request so far (nginx writes a request's
        line when it has answered it, unbuffered)."""
        out = []
        for line in (self.prefix / "access.log").read_text().splitlines():
            path, _, addrs = line.partition(" ")
            out.append((path, [int(a.strip().rsplit(":", 1)[1]) for a in addrs.split(",")]))
        return out

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def __enter__(self) -> "Balancer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
