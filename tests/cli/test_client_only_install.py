"""The client-only install: a fresh venv with the client and the service distribution without
extras (``pip install ./clients .``, as the README says) gives a ``healthsvc`` command whose client
commands work with the standard library alone, against a real server. The venv is made once per
module from the session's wheels (``tests/packaging/dists.py``: offline, a few seconds)."""
from __future__ import annotations

import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from healthsvc_client.client import Run
from tests.packaging.dists import CLIENT, ROOT, SERVICE, clean_env, installed, make_venv, pip_install


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory, wheels) -> Path:
    """A fresh venv with the two distributions installed as the README's training-node line says."""
    readme = (ROOT / "README.md").read_text()
    assert "`pip install ./clients .`" in readme                 # what this fixture installs
    venv = make_venv(tmp_path_factory.mktemp("client-install") / "venv")
    pip_install(venv, wheels, CLIENT, SERVICE)
    return venv


def cli(venv: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "healthsvc"), *args], capture_output=True, text=True,
                          timeout=60, env=clean_env(**(env or {})), cwd=venv)


def test_the_install_has_no_dependencies_and_serve_says_what_to_install(client_venv):
    assert set(installed(client_venv)) == {CLIENT, SERVICE}, installed(client_venv)
    assert cli(client_venv, "--version").stdout.strip() == "healthsvc 0.1.0"
    out = cli(client_venv, "serve")
    assert out.returncode == 2 and "pip install 'healthsvc[server]'" in out.stderr


def test_runs_status_rollback_and_bisect_against_a_real_server(client_venv, shared_server, shared_http):
    for s in range(0, 400, 100):
        r = shared_http.post("/v1/runs/cli-run/checkpoints", json={"step": s + 99, "uri": f"file:///ckpt/{s + 99}"})
        assert r.status_code < 300, r.text
    records = [{"step": s, "rank": r, "loss": 1.0, "grad_norm": 1.0} for s in range(400) for r in range(2)]
    assert shared_http.post("/v1/runs/cli-run/metrics", json={"records": records}).status_code == 202
    shared_http.post("/v1/runs/cli-empty/metrics", json={"records": [{"step": 0, "rank": 0, "loss": 1.0}]})

    out = cli(client_venv, "runs", env={"HEALTHSVC_URL": shared_server.url})   # the URL from the env
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == ["RUN", "STATUS", "STEP", "RANKS", "LAST", "PUSH"]
    row = next(r for r in rows if r.startswith("cli-run "))
    assert row.split()[:4] == ["cli-run", "running", "399", "2"]
    assert header.index("STEP") == row.index("399")                       # aligned columns

    out = cli(client_venv, "status", "cli-run", "--url", shared_server.url)
    assert out.returncode == 0, out.stderr
    head = out.stdout.split("\n\n")[0].splitlines()                            # then a findings table
    lines = dict(re.match(r"(\w[\w ]*):\s+(.*)", line).groups() for line in head)
    assert lines["run"] == "cli-run" and lines["step"] == "399" and lines["ranks"] == "2 of 2"
    assert lines["rollback"] == "step 399 (file:///ckpt/399)"
    assert len({len(re.match(r"[^:]*:\s+", line).group()) for line in head}) == 1  # aligned
    out = cli(client_venv, "status", "no-such-run", "--url", shared_server.url)
    assert out.returncode == 1 and "404" in out.stderr and "does not exist" in out.stderr

    out = cli(client_venv, "rollback", "cli-run", "--url", shared_server.url)
    assert out.returncode == 0 and out.stdout.splitlines()[0] == "file:///ckpt/399"
    out = cli(client_venv, "rollback", "cli-empty", "--url", shared_server.url)
    assert out.returncode == 3 and out.stdout.splitlines()[0] == "none"      # nothing to resume

    url = ["--url", shared_server.url]
    out = cli(client_venv, "bisect", "start", "cli-run", "--steps", "99", "199", "299", "399", *url)
    assert out.returncode == 0, out.stderr
    verdicts = {99: "good", 199: "good", 299: "bad", 399: "bad"}
    for _ in range(4):
        if "done after" in out.stdout:
            break
        probe = int(re.search(r"probe:\s+step (\d+)", out.stdout).group(1))
        assert "None" not in out.stdout
        out = cli(client_venv, "bisect", "report", "cli-run", str(probe), verdicts[probe], *url)
        assert out.returncode == 0, out.stderr
    assert "done after" in out.stdout and "None" not in out.stdout
    assert "last good:  step 199" in out.stdout and "first bad:  step 299" in out.stdout
    status = cli(client_venv, "bisect", "status", "cli-run", *url)
    assert status.returncode == 0 and status.stdout == out.stdout
    assert cli(client_venv, "bisect", "abandon", "cli-run", *url).returncode == 0

    out = cli(client_venv, "runs", "--url", "http://127.0.0.1:9")               # nothing listens
    assert out.returncode == 2 and "cannot reach" in out.stderr


def test_a_bisection_where_every_probe_is_good_never_prints_none(client_venv, shared_server, shared_http):
    records = [{"step": s, "rank": 0, "loss": 1.0} for s in range(300)]
    assert shared_http.post("/v1/runs/cli-good/metrics", json={"records": records}).status_code == 202
    for s in (99, 199, 299):
        shared_http.post("/v1/runs/cli-good/checkpoints", json={"step": s, "uri": f"file:///g/{s}"})
    url = ["--url", shared_server.url]
    out = cli(client_venv, "bisect", "start", "cli-good", "--steps", "99", "199", "299", *url)
    while "done after" not in out.stdout:
        assert out.returncode == 0, out.stderr
        probe = re.search(r"probe:\s+step (\d+)", out.stdout).group(1)
        out = cli(client_venv, "bisect", "report", "cli-good", probe, "good", *url)
    assert "None" not in out.stdout and "first bad:  none (every probed checkpoint was good)" in out.stdout


def test_sync_uploads_a_spool(client_venv, shared_server, shared_http, tmp_path):
    spool = tmp_path / "rank0.jsonl"
    run = Run(None, "cli-sync", 0, mode="offline", spool_path=str(spool))
    for step in range(5):
        run.log(loss=1.0, step=step)
    run.finish()
    out = cli(client_venv, "sync", str(spool), "--url", shared_server.url)
    assert out.returncode == 0, out.stderr
    assert shared_http.get("/v1/runs/cli-sync/metrics").json()["columns"]["step"] == list(range(5))


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self):  # noqa: N802
        type(self).seen.append(dict(self.headers))
        body = b"[]"
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_token_goes_out_as_a_bearer_header(client_venv):
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        out = cli(client_venv, "runs", "--url", url, env={"HEALTHSVC_TOKEN": "s3cret"})
        assert out.returncode == 0 and out.stdout.startswith("no runs")
        out = cli(client_venv, "runs", "--url", url)
        assert out.returncode == 0
    finally:
        server.shutdown()
    assert [h.get("Authorization") for h in _Recorder.seen] == ["Bearer s3cret", None]


def test_status_lists_active_findings_and_exit_status_says_critical(client_venv, shared_server, shared_http):
    records = [{"step": s, "rank": r, "loss": "NaN" if (s, r) == (8, 1) else 1.0, "local_grad_norm": 1.0}
               for s in range(10) for r in range(2)]
    assert shared_http.post("/v1/runs/cli-nan/metrics", json={"records": records}).status_code == 202
    url = ["--url", shared_server.url]
    shared_http.drain()   # the NaN is a finding
    out = cli(client_venv, "status", "cli-nan", "--exit-status", *url)
    assert out.returncode == 4, (out.returncode, out.stderr)
    head, findings = out.stdout.split("\n\n")
    assert "health:     critical" in head
    header, *rows = findings.splitlines()
    assert header.split() == ["FINDING", "SEVERITY", "STEP", "RANKS"]
    assert any(r.split() == ["non_finite", "critical", "8", "1"] for r in rows), rows
    assert cli(client_venv, "status", "cli-nan", *url).returncode == 0    # without the flag: answered
