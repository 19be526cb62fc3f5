"""Every bench script runs at smoke sizes and prints its table, so none breaks unseen.

Benchmarks report; these tests assert only that a script exited 0 and printed at least one
markdown table with figures (the convention of ``bench/tables.py``, which ``bench/ab.py`` reads).
The scripts are found, not listed: a script in ``bench/`` (a file with a ``__main__`` guard) is
run with ``--smoke``, which every script accepts (a second or a few, tiny sizes). A new script is
tested from the start, and fails here until it has a smoke mode.

The scripts run two at a time (most of a smoke run is a server starting or a client waiting);
each still has its own test.
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.tables import cells, parse

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

# Second forms of a script, run with their flags and --smoke too: each is a bench of its own.
FORMS = ["alert_latency.py --load", "scale.py --grid", "ab_concurrent.py --per-thread --env HEALTHSVC_INGEST_FAST_PATH=0"]

# Scripts this module does not run, and why.
NO_SMOKE = {
    "ab.py": "runs another script on two trees, not a bench: tests/bench/test_ab.py runs it on a scratch repository",
    "soak.py": "tests/replicas/test_soak_short.py runs its two-minute form and reads every table it prints",
}


def scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def user_env() -> dict[str, str]:
    """The environment a user runs a bench in: this tree's code, none of the suite's settings
    (tests/conftest.py opens loopback webhooks for the tests' own servers; a bench must open
    what it needs itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALTHSVC_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def smoke(script: str) -> subprocess.CompletedProcess:
    name, *flags = script.split()
    return subprocess.run([sys.executable, str(BENCH / name), "--smoke", *flags], cwd=ROOT, env=user_env(),
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def smoke_runs(request):
    """script -> its smoke run, started for every selected test of this module at once."""
    selected = [item.callspec.params["script"] for item in request.session.items
                if getattr(item, "module", None) is request.module and hasattr(item, "callspec")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {s: pool.submit(smoke, s) for s in selected}


@pytest.mark.parametrize("script", [s for s in scripts() if s not in NO_SMOKE] + FORMS)
def test_bench_runs_and_prints_its_table(script, smoke_runs: dict[str, Future]):
    proc = smoke_runs[script].result()
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert parse(proc.stdout), f"{script} --smoke printed no markdown table of figures:\n{proc.stdout[-3000:]}"


def test_every_exemption_names_a_script():
    assert set(NO_SMOKE) <= set(scripts())
    assert {form.split()[0] for form in FORMS} <= set(scripts())


@pytest.mark.parametrize("script", ["recovery.py"])
def test_recovery_prints_both_restarts_and_the_supervised_one_trains_on_no_corrupted_state(
        script, smoke_runs: dict[str, Future]):
    # The measure (#27): both rows; the supervised restart resumes from the rollback
    # answer's checkpoint (the bench exits non-zero otherwise), so it throws away no step that
    # answer calls clean, and its next attempt's fingerprints find no corruption; the naive one
    # resumes after the flip, and every step after it is corrupted.
    proc = smoke_runs[script].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {cells(line)[0].split(" (")[0]: cells(line)[1:] for line in proc.stdout.splitlines()
            if line.startswith(("| healthsvc supervise", "| naive restart"))}
    assert set(rows) == {"healthsvc supervise", "naive restart"}, proc.stdout
    resumed, healthy_s, thrown, clean_thrown, corrupted, after = rows["healthsvc supervise"]
    n_resumed, n_healthy_s, _, _, n_corrupted, n_after = rows["naive restart"]
    assert int(resumed) < int(n_resumed) and int(after) == 0 and healthy_s != "never", proc.stdout
    assert int(n_after) > 0 and n_healthy_s == "never" and int(n_corrupted) > int(corrupted), proc.stdout
