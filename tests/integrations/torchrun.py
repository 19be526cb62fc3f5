"""Run a script as a 2-process CPU (gloo) job under torchrun (or ``accelerate launch``), as the
integration tests' users do."""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def skip_unless_installed(*packages: str) -> None:
    """Skip the calling module when one of ``packages`` is not installed, found without importing
    it: every worker collects each module, and importing torch, transformers, accelerate or
    Lightning there cost each worker a second or more."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}", allow_module_level=True)


LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    # --multi_gpu is accelerate's torchrun launcher; the script's Accelerator(cpu=True) makes it gloo.
    # (--cpu would be its single-process launcher.) The rest says what an unconfigured accelerate asks.
    "accelerate launch": [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
}


def torchrun(script: Path, *args: str, cwd: Path, timeout_s: float = 240, launcher: str = "torchrun") -> None:
    """Run ``script`` with ``args`` on 2 processes (``launcher``: a key of ``LAUNCHERS``); fail the
    test with its stderr if it fails."""
    cmd = [*LAUNCHERS[launcher], str(script), *args]
    # One thread per process: the machine is shared, and two processes each using every core
    # would make the gloo collectives the slowest part by far.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
    assert out.returncode == 0, out.stderr[-4000:]


def job_parser(steps: int = 6) -> argparse.ArgumentParser:
    """The arguments every training script run here takes: where to report, and how long."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="healthsvc base URL")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--steps", type=int, default=steps)
    return parser
