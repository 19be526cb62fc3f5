"""The house rules of ``detectors/``: pure (it imports nothing of the service, the client or the
simulation), shipped with its ``offline/`` and ``stats/`` subpackages, while ``simulation/`` is not."""
from __future__ import annotations

import fnmatch
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import detectors

ROOT = Path(__file__).resolve().parents[2]


def test_detectors_import_nothing_of_ours_nor_of_the_web():
    modules = sorted(m.name for m in pkgutil.walk_packages(detectors.__path__, "detectors."))
    assert {"detectors.registry", "detectors.offline.onset", "detectors.offline.economics.goodput",
            "detectors.stats.trend"} <= set(modules)
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = set(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split())
    assert not loaded & {"healthsvc", "clients", "simulation", "tests", "fastapi", "httpx", "sqlite3",
                         "pydantic", "pandas", "torch"}


def test_the_simulation_is_not_shipped_and_the_maths_is():
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    # setuptools' rule: a package (a folder with __init__.py) whose dotted name matches a pattern.
    tops = [d for d in ROOT.iterdir() if d.is_dir() and (d / "__init__.py").exists()]
    packages = {".".join(init.parent.relative_to(ROOT).parts) for top in tops for init in top.rglob("__init__.py")}
    shipped = {name for name in packages if any(fnmatch.fnmatchcase(name, pat) for pat in include)}
    assert {"detectors", "detectors.offline", "detectors.offline.economics", "detectors.stats"} <= shipped
    assert not {p for p in shipped if p.split(".")[0] in ("simulation", "tests", "bench", "examples")}
