"""``healthsvc alerts``, ``ack``, ``silence add|list|expire`` and ``findings`` from the client-only
install (the venv of ``test_client_only_install``: no server packages), against a real server
(uvicorn on 127.0.0.1) whose alert comes from a NaN pushed through the real detectors."""
from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest

from tests.cli.test_client_only_install import cli, client_venv  # noqa: F401 - the venv fixture

pytestmark = [pytest.mark.timeout(300)]

RUN = "cli-alerts"


def rows(stdout: str) -> list[list[str]]:
    """A table's rows (header first), each split into its columns by the header's positions."""
    header, *lines = stdout.splitlines()
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, starts[1:] + [None]))
    return [[line[a:b].strip() for a, b in bounds] for line in [header, *lines]]


@pytest.fixture(scope="module")
def firing(shared_server, shared_http) -> dict:
    """A run with one firing non_finite alert; its alert as the API shows it."""
    records = [{"step": s, "rank": r, "loss": "NaN" if (s, r) == (8, 1) else 1.0, "local_grad_norm": 1.0}
               for s in range(10) for r in range(2)]
    assert shared_http.post(f"/v1/runs/{RUN}/metrics", json={"records": records}).status_code == 202
    shared_http.drain()
    (alert,) = shared_http.get("/v1/alerts", params={"run": RUN, "kind": "non_finite"}).json()["alerts"]
    return alert


def test_alerts_lists_the_firing_alert_and_ack_acknowledges_it(client_venv, shared_server, shared_http, firing):
    url = ["--url", shared_server.url]
    out = cli(client_venv, "alerts", "--run", RUN, *url)
    assert out.returncode == 0, out.stderr
    header, *table = rows(out.stdout)
    assert header == ["FINGERPRINT", "ALERT", "RUN", "RANK", "SEVERITY", "STATE", "SINCE", "SUMMARY"]
    row = next(r for r in table if r[1] == "non_finite")
    assert row[:6] == [firing["fingerprint"], "non_finite", RUN, "1", "critical", "firing"]
    assert row[7].startswith("non finite in loss on rank 1 of run cli-alerts")
    listed = json.loads(cli(client_venv, "alerts", "--run", RUN, "--json", *url).stdout)
    assert firing["fingerprint"] in {a["fingerprint"] for a in listed["alerts"]}

    out = cli(client_venv, "ack", firing["fingerprint"], "--by", "ann", *url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"acknowledged {firing['fingerprint']} (non_finite, run {RUN}) by ann"
    assert shared_http.get(f"/v1/alerts/{firing['fingerprint']}").json()["acknowledged_by"] == "ann"
    out = cli(client_venv, "alerts", "--run", RUN, "--kind", "non_finite", *url)
    assert rows(out.stdout)[1][5] == "acked"

    out = cli(client_venv, "ack", "0123456789abcdef", *url)      # no such alert
    assert out.returncode == 1 and "404" in out.stderr and "0123456789abcdef" in out.stderr
    out = cli(client_venv, "alerts", "--run", "no-such-run", *url)
    assert out.returncode == 0 and out.stdout.strip() == f"no firing alerts on {shared_server.url} for run no-such-run"
    out = cli(client_venv, "alerts", "--url", "http://127.0.0.1:9")   # nothing listens
    assert out.returncode == 2 and "cannot reach" in out.stderr


def test_silence_add_list_expire(client_venv, shared_server, shared_http, firing):
    url = ["--url", shared_server.url]
    out = cli(client_venv, "silence", "add", f"run={RUN}", "non_finite", "--duration", "2h",
              "--comment", "node0 being drained", "--by", "ann", *url)
    assert out.returncode == 0, out.stderr
    sid, said = out.stdout.splitlines()
    assert sid.startswith("sil_") and said.startswith(f'silences run="{RUN}" alertname="non_finite" until ')
    (stored,) = [s for s in shared_http.get("/v1/silences").json()["silences"] if s["id"] == sid]
    assert stored["created_by"] == "ann" and stored["comment"] == "node0 being drained"
    assert abs(stored["ends_at"] - stored["starts_at"] - 7200) < 1e-6 and stored["state"] == "active"

    out = cli(client_venv, "silence", "list", *url)
    assert out.returncode == 0, out.stderr
    header, *table = rows(out.stdout)
    assert header == ["ID", "MATCHERS", "STATE", "ENDS", "BY", "COMMENT"]
    assert [r for r in table if r[0] == sid][0][2:] == ["active", time.strftime("%Y-%m-%d %H:%M UTC",
                                                        time.gmtime(stored["ends_at"])), "ann", "node0 being drained"]
    out = cli(client_venv, "alerts", "--run", RUN, "--kind", "non_finite", *url)
    assert rows(out.stdout)[1][5] == "silenced"

    # Bad input: said locally when the command line is wrong, by the service when a value is.
    out = cli(client_venv, "silence", "add", f"run={RUN}", "--duration", "2h", *url)
    assert out.returncode == 2 and "--comment" in out.stderr
    out = cli(client_venv, "silence", "add", "run exp", "--duration", "2h", "--comment", "x", *url)
    assert out.returncode == 2 and "'run exp' is not a matcher" in out.stderr
    out = cli(client_venv, "silence", "add", f"run={RUN}", "--duration", "2 hours", "--comment", "x", *url)
    assert out.returncode == 2 and "is not a duration" in out.stderr
    out = cli(client_venv, "silence", "add", "run=~(", "--duration", "2h", "--comment", "x", *url)
    assert out.returncode == 1 and "422" in out.stderr and "regex" in out.stderr

    out = cli(client_venv, "silence", "expire", sid, *url)
    assert out.returncode == 0 and out.stdout.strip() == f"expired {sid}"
    assert sid not in cli(client_venv, "silence", "list", *url).stdout
    out = cli(client_venv, "silence", "list", "--all", "--json", *url)
    assert [s["state"] for s in json.loads(out.stdout)["silences"] if s["id"] == sid] == ["expired"]
    out = cli(client_venv, "silence", "expire", "sil_000000000000", *url)
    assert out.returncode == 1 and "404" in out.stderr


def test_findings_lists_what_the_detectors_found(client_venv, shared_server, firing):
    url = ["--url", shared_server.url]
    out = cli(client_venv, "findings", RUN, "--kind", "non_finite", *url)
    assert out.returncode == 0, out.stderr
    header, *table = rows(out.stdout)
    assert header == ["ID", "STEP", "KIND", "SEVERITY", "STATUS", "RANKS", "HOSTS", "METRIC"]
    assert any(r[1:6] == ["8", "non_finite", "critical", "firing", "1"] for r in table), table
    assert all(r[2] == "non_finite" for r in table)
    got = json.loads(cli(client_venv, "findings", RUN, "--json", *url).stdout)
    assert {f["kind"] for f in got} >= {"non_finite"} and all("evidence" in f for f in got)
    out = cli(client_venv, "findings", RUN, "--kind", "nope", *url)
    assert out.returncode == 1 and "422" in out.stderr and "kind" in out.stderr


DOCS = Path(__file__).resolve().parents[2] / "docs"


def documented_commands() -> list[str]:
    """Every ``healthsvc ...`` command line the runbook and the alerting page show, and the
    README's on-call ones."""
    lines = re.findall(r"`(healthsvc [^`]+)`", (DOCS / "runbook.md").read_text())
    lines += re.findall(r"`(healthsvc (?:alerts|ack|silence|findings)\b[^`]*)`", (DOCS.parent / "README.md").read_text())
    block = re.search(r"### From the command line.*?```bash\n(.*?)```", (DOCS / "alerting.md").read_text(), re.S)
    lines += [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if not line.endswith("--help")]


@pytest.mark.parametrize("line", documented_commands())
def test_every_documented_command_line_is_one_the_cli_takes(line, capsys):
    """Parsed by the real CLI against a URL nothing listens on: a usage error exits 2 with
    argparse's ``error:``; a line it takes gets as far as the request (``cannot reach``)."""
    from healthsvc.cli import main

    argv = shlex.split(line.replace("$RUN", "exp-42").replace("FINGERPRINT", "3f2a9c0d1e2b4f5a"))[1:]
    try:
        rc = main([*argv, "--url", "http://127.0.0.1:9"])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and "cannot reach" in err and "error:" not in err, (line, err)
