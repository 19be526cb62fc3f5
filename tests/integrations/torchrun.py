"""Run a script as a 2-process CPU (gloo) job under torchrun, as the integration tests' users do."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torchrun(script: Path, *args: str, cwd: Path, timeout_s: float = 240) -> None:
    """Run ``script`` with ``args`` on 2 processes; fail the test with its stderr if it fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script), *args]
    # One thread per process: the machine is shared, and two processes each using every core
    # would make the gloo collectives the slowest part by far.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
    assert out.returncode == 0, out.stderr[-4000:]
