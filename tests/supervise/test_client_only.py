"""``healthsvc supervise`` in the client-only install (no FastAPI, no pydantic: the standard
library only), against a real server."""
from __future__ import annotations

from tests.cli.test_client_only_install import cli, client_venv  # noqa: F401 (the venv fixture)


def test_supervise_runs_a_job_from_the_client_only_install(
        client_venv, shared_server, shared_http):  # noqa: F811 (the imported fixture)
    assert shared_http.put("/v1/runs/sup-client", json={"world_size": 3}).status_code == 200
    python = str(client_venv / "bin" / "python")
    out = cli(client_venv, "supervise", "--run-id", "sup-client", "--url", shared_server.url,
              "--poll-s", "0.2", "--", python, "-c",
              "import sys, time; time.sleep(0.5); print(sys.argv[1:])", "{world_size}", "{checkpoint}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['3', '']"          # the run's world size; no checkpoint yet
    assert "continue (healthy)" in out.stderr and "the job finished (exit status 0)" in out.stderr
