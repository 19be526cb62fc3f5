"""Offline mode end to end: the client spools to a file, `healthsvc sync` uploads it, and a
second sync does not duplicate anything."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.both_stores

import math
import subprocess
import sys

from clients.client import Run


def test_offline_spool_then_sync(server, http, tmp_path):
    spool = tmp_path / "rank0.jsonl"
    run = Run(None, "offline-run", 0, mode="offline", spool_path=str(spool))
    for step in range(20):
        run.log(loss=float("nan") if step == 13 else 1.0 / (step + 1), step=step)
    run.checkpoint(10, "file:///ckpt/10", duration_s=1.5)
    run.finish()
    assert spool.exists()

    cmd = [sys.executable, "-m", "healthsvc", "sync", str(spool), "--url", server.url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "synced" in out.stdout and "[1/1]" in out.stdout

    cols = http.get("/v1/runs/offline-run/metrics").json()["columns"]
    assert cols["step"] == list(range(20))
    assert cols["loss"][13] == "NaN" and math.isclose(cols["loss"][1], 0.5)
    assert [c["step"] for c in http.get("/v1/runs/offline-run/checkpoints").json()] == [10]
    assert http.get("/v1/runs/offline-run").json()["status"] == "finished"

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert http.get("/v1/runs/offline-run/metrics").json()["columns"]["step"] == list(range(20))


def test_sync_reports_a_missing_file(tmp_path):
    out = subprocess.run([sys.executable, "-m", "healthsvc", "sync", str(tmp_path / "nope.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no such spool file" in out.stderr
