"""The PostgreSQL password never reaches a log line (issue 25, defect 7): a real server started
on a URI with a password, its whole output read after a push, a readiness probe and a stop; and
the refusal of an unreachable store."""
from __future__ import annotations

import subprocess
import sys

import httpx

from tests.pg import fresh_database
from tests.server_process import ServerProcess, free_port

PASSWORD = "S3cretPW"


def _with_password(uri: str) -> str:
    # The test server trusts local connections, so the password is accepted and ignored.
    return uri.replace("postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@", 1)


def test_a_served_store_uri_is_logged_without_its_password(tmp_path):
    with fresh_database() as dsn:
        uri = _with_password(dsn)
        assert PASSWORD in uri
        srv = ServerProcess(uri, log_path=tmp_path / "server.log", extra_args=["--log-level", "debug", "--access-log"])
        with srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.post("/v1/runs/r/metrics", json={"records": [{"step": 0, "rank": 0, "loss": 1.0}]}).status_code == 202
            ready = http.get("/readyz")
            assert ready.status_code == 200 and PASSWORD not in ready.text
        log = (tmp_path / "server.log").read_text()
    assert "healthsvc: serving on" in log and "postgresql://postgres:***@" in log   # the line is there, redacted
    assert "migrated to schema version" in log                                     # and the store's own lines
    assert PASSWORD not in log


def test_an_unreachable_store_is_refused_without_its_password():
    uri = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/nowhere"
    out = subprocess.run([sys.executable, "-m", "healthsvc", "serve", "--db", uri, "--port", str(free_port())],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cannot open the store postgresql://postgres:***@" in out.stderr
    assert PASSWORD not in out.stdout + out.stderr
