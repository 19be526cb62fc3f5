"""The project's two distributions, built and installed the way a user's ``pip install`` does, but
fast and offline: built once per test session from a copy of the checkout (building in place would
litter it) with the test venv's setuptools (no build isolation, no index), and installed into fresh
venvs from those wheels only (``--no-index --find-links``), by the test venv's pip (``--python``:
no pip is copied into each venv)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(".venv", ".git", "*.db", "*.db-*", "__pycache__", "build", "dist", "*.egg-info",
                              ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", "notebooks", "tests",
                              "bench", "examples", "simulation")
CLIENT, SERVICE = "healthsvc-client", "healthsvc"


def build_wheels(base: Path) -> Path:
    """Both wheels (``clients/`` as healthsvc-client, the checkout as healthsvc) in ``base/wheels``."""
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)
    out = base / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(out), str(src / "clients"), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def make_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path


def pip_install(venv: Path, wheels: Path, *requirements: str) -> None:
    """``pip install REQUIREMENTS`` into ``venv`` with nothing but ``wheels`` to choose from."""
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "-q", "--no-index", "--find-links", str(wheels), *requirements],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this test run's Python or healthsvc settings (no PYTHONPATH into the
    checkout), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEALTHSVC_", "PYTHON", "VIRTUAL_ENV"))}
    return {**env, **extra}


def installed(venv: Path) -> dict[str, str]:
    """Distribution name -> version, as the venv's own Python sees them."""
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True,
                         env=clean_env(), timeout=60, cwd=venv)   # not the checkout: its *.egg-info would count
    return json.loads(out.stdout)
