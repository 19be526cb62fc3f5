"""The README is true: its quick-start commands are the ones CI runs and they work.

`./dev test` is what `.ci/run` executes (this very suite); this test starts `./dev serve` the way
the README says, on a free port and a temporary store, and waits for it to be ready."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from tests.barriers import answers_ok, wait_until
from tests.server_process import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```sh\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["./dev serve", "./dev test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./dev test" in ci


def test_dev_serve_starts_the_service(tmp_path):
    port = free_port()
    proc = subprocess.Popen([str(ROOT / "dev"), "serve", "--port", str(port), "--db", str(tmp_path / "q.db")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def ready() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            return answers_ok(f"http://127.0.0.1:{port}/readyz")
        # The first run may install the server's dependencies.
        wait_until(ready, timeout_s=240, interval_s=0.2, what="./dev serve to become ready")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/runs", timeout=5) as r:
            assert r.read() == b"[]"
        assert (tmp_path / "q.db").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def test_the_readme_webhook_settings_are_valid_settings(monkeypatch):
    from healthsvc.alerting.subscription import Subscription
    from healthsvc.settings import Settings

    readme = (ROOT / "README.md").read_text()
    value = re.search(r"export HEALTHSVC_ALERT_WEBHOOKS='(.*?)'", readme, re.S).group(1)
    monkeypatch.setenv("HEALTHSVC_ALERT_WEBHOOKS", value)
    subs = [Subscription.from_dict(d) for d in Settings().alert_webhooks]
    assert [(s.id, s.format) for s in subs] == [("am", "alertmanager"), ("slack", "slack"), ("ops", "json"),
                                                ("alertmanager", "alertmanager_api"), ("pagerduty", "pagerduty")]
    assert subs[2].request_headers() == {"X-Team": "ml-infra", "Authorization": "Bearer ops-token"}
    assert subs[3].pass_through and subs[3].delivery_url == "http://alertmanager:9093/api/v2/alerts"


def test_the_readme_restart_snippet_reads_the_uri_from_the_first_line(shared_server, shared_http):
    shared_http.post("/v1/runs/readme-run/metrics", json={"records": [{"step": s, "rank": 0, "loss": 1.0}
                                                                      for s in range(5)]})
    shared_http.post("/v1/runs/readme-run/checkpoints", json={"step": 4, "uri": "file:///ckpt/4"})
    readme = (ROOT / "README.md").read_text()
    assert 'CKPT=$(healthsvc rollback "$RUN" | head -n 1)' in readme
    import sys
    out = subprocess.run([sys.executable, "-m", "healthsvc", "rollback", "readme-run", "--url", shared_server.url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.splitlines()[0] == "file:///ckpt/4"
