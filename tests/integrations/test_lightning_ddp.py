"""The Lightning callback in a real 2-process DDP training (torchrun, gloo, CPU) against a real
server: per-rank ``local_grad_norm`` from before the all-reduce names the rank a NaN came from, and
ModelCheckpoint's saves are registered with their durations and sizes."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def test_local_grad_norm_names_the_nan_rank_and_checkpoints_carry_durations(shared_server, shared_http, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "integrations" / "lightning_ddp_train.py"),
           "--url", shared_server.url, "--run-id", "pl-ddp", "--ckpt-dir", str(ckpt_dir)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]

    cols = shared_http.get("/v1/runs/pl-ddp/metrics").json()["columns"]
    by = {(s, r): i for i, (s, r) in enumerate(zip(cols["step"], cols["rank"]))}
    assert sorted(by) == [(s, r) for s in range(6) for r in (0, 1)]

    def val(field, step, rank):
        v = cols[field][by[(step, rank)]]
        return float(v) if isinstance(v, str) else v       # "NaN" travels as a string

    for step in range(3):
        l0, l1 = val("local_grad_norm", step, 0), val("local_grad_norm", step, 1)
        g0, g1 = val("grad_norm", step, 0), val("grad_norm", step, 1)
        assert l0 > 0 and l1 > 0 and l0 != l1                 # each rank's own gradients
        assert g0 == pytest.approx(g1, rel=1e-6)              # after the all-reduce: the same
        assert g0 <= (l0 + l1) / 2 * (1 + 1e-6)               # the norm of the mean <= the mean of norms
    assert math.isnan(val("local_grad_norm", 3, 1)) and math.isfinite(val("local_grad_norm", 3, 0))
    assert math.isnan(val("grad_norm", 3, 0)) and math.isnan(val("grad_norm", 3, 1))

    findings = _wait_for(shared_http, "pl-ddp", "non_finite")
    summary = [(f["metric"], f["step"], f["ranks"], f["evidence"]["role"]) for f in findings]
    # The first non-finite local values: rank 1's, at step 3 (rank 0's own go NaN at step 4, after
    # the poisoned update). (Which findings the detector adds as other ranks' pushes arrive is the
    # monitor's business, not the callback's.)
    assert ("local_grad_norm", 3, [1], "origin") in summary, summary
    assert min((step, ranks) for metric, step, ranks, _ in summary if metric == "local_grad_norm") == (3, [1])

    ckpts = shared_http.get("/v1/runs/pl-ddp/checkpoints").json()
    assert [c["step"] for c in ckpts] == [1, 3, 5]            # saved after 2, 4, 6 updates
    for c in ckpts:
        assert c["duration_s"] > 0 and c["bytes"] == os.path.getsize(c["uri"]) > 0
        assert Path(c["uri"]).parent == ckpt_dir


def _wait_for(http, run_id, kind):
    """The run's ``kind`` findings, once the service has processed all it was sent."""
    http.drain()
    items = http.get(f"/v1/runs/{run_id}/findings", params={"kind": kind}).json()
    assert items, f"no {kind} finding"
    return items
