"""A PostgreSQL cluster of the test's own, made with ``initdb`` in a temporary directory on a
free port, that the test may SIGKILL and start again (the machine's server on 5432 is never
touched). As root, the cluster runs as the ``postgres`` user (initdb refuses root).

    with PgCluster() as pg:        # postgresql://postgres@127.0.0.1:<port>/postgres
        pg.kill(); pg.start()
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from healthsvc.local_server import free_port
from tests.barriers import wait_until


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"no PostgreSQL {name} under /usr/lib/postgresql/*/bin")
    return found[-1]


class PgCluster:
    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="hs-pg-"))
        self.data = self.root / "data"
        self.proc: subprocess.Popen | None = None
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)

    @property
    def uri(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def __repr__(self) -> str:
        return f"PgCluster(port={self.port}, pid={self.proc.pid if self.proc else None})"

    def init(self) -> "PgCluster":
        subprocess.run([*self._as, _bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
        return self

    def start(self, timeout_s: float = 30.0) -> "PgCluster":
        """Start the postmaster (after a SIGKILL it recovers from its WAL first)."""
        log = open(self.root / "postgres.log", "ab")
        self.proc = subprocess.Popen(
            [*self._as, _bin("postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.root),
             "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=100", "-c", "shared_buffers=16MB"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(lambda: self.proc.poll() is not None or self.accepts(), timeout_s, "the test's PostgreSQL up")
        assert self.proc.poll() is None, (self.root / "postgres.log").read_text()[-2000:]
        return self

    def accepts(self) -> bool:
        return subprocess.run([_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                              capture_output=True).returncode == 0

    def postmaster_pid(self) -> int:
        """The postmaster's own pid (under runuser, ``proc`` is runuser's)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crash would; its backends notice and exit on their own."""
        pid = self.postmaster_pid()
        backends = _children(pid)
        os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)
        # A new postmaster refuses to start while the old one's backends hold its shared memory.
        wait_until(lambda: not any(_alive(b) for b in backends), 15, "the killed postmaster's backends gone")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.postmaster_pid(), signal.SIGQUIT)   # immediate shutdown
            except (OSError, ValueError):
                pass
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


    def __enter__(self) -> "PgCluster":
        return self.init().start()

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _children(pid: int) -> list[int]:
    """Pids of the processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
