"""The house rules of ``detectors/``: pure (it imports nothing of the service, the client or the
simulation), shipped (as ``healthsvc_detectors``) with its ``offline/`` and ``stats/`` subpackages,
while ``simulation/`` is not."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import healthsvc_detectors

ROOT = Path(__file__).resolve().parents[2]


def test_detectors_import_nothing_of_ours_nor_of_the_web():
    modules = sorted(m.name for m in pkgutil.walk_packages(healthsvc_detectors.__path__, f"{healthsvc_detectors.__name__}."))
    assert {"healthsvc_detectors.registry", "healthsvc_detectors.offline.onset", "healthsvc_detectors.offline.economics.goodput",
            "healthsvc_detectors.stats.trend"} <= set(modules)
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = set(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split())
    assert not loaded & {"healthsvc", "healthsvc_client", "simulation", "tests", "fastapi", "httpx", "sqlite3",
                         "pydantic", "pandas", "torch"}


def test_the_simulation_is_not_shipped_and_the_maths_is(wheels):
    """What the service wheel holds (``detectors/`` ships as ``healthsvc_detectors``, setup.py)."""
    [wheel] = wheels.glob("healthsvc-*.whl")
    packages = {str(Path(n).parent).replace("/", ".") for n in zipfile.ZipFile(wheel).namelist()
                if n.endswith("/__init__.py")}
    assert {"healthsvc_detectors", "healthsvc_detectors.offline", "healthsvc_detectors.offline.economics",
            "healthsvc_detectors.stats"} <= packages
    assert {p.split(".")[0] for p in packages} == {"healthsvc", "healthsvc_detectors"}   # no simulation, tests, ...
