"""examples/accelerate_train.py, run as its docstring says (torchrun, 2 processes, gloo, CPU),
against a real server: every process reports its own loss and pre-all-reduce gradient norm, and the
main process registers the checkpoints with their durations."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def test_the_accelerate_example_reports_every_process(shared_server, shared_http, tmp_path):
    example = ROOT / "examples" / "accelerate_train.py"
    assert "torchrun --nproc_per_node 2 examples/accelerate_train.py --url" in example.read_text()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(example),
           "--url", shared_server.url, "--run-id", "acc-1", "--ckpt-dir", str(tmp_path / "ckpt")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]

    cols = shared_http.get("/v1/runs/acc-1/metrics").json()["columns"]
    rows = list(zip(cols["step"], cols["rank"], cols["loss"], cols["grad_norm"], cols["local_grad_norm"]))
    assert [(s, r) for s, r, *_ in rows] == [(s, r) for s in range(8) for r in (0, 1)]
    for s in range(8):
        (_, _, loss0, g0, l0), (_, _, loss1, g1, l1) = rows[2 * s], rows[2 * s + 1]
        assert loss0 != loss1 and l0 != l1                     # each process's own batch
        assert g0 == pytest.approx(g1, rel=1e-6)               # all-reduced: the same
        assert g0 <= (l0 + l1) / 2 * (1 + 1e-6)
    ckpts = shared_http.get("/v1/runs/acc-1/checkpoints").json()
    assert [c["step"] for c in ckpts] == [3, 7]
    assert all(c["duration_s"] > 0 and Path(c["uri"]).is_dir() for c in ckpts)
