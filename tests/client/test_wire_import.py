"""The wire vocabulary is shared without the trainer client: the service imports ``healthsvc_client.wire``
and must not load ``healthsvc_client.client`` (its fork and exit handlers) on the way."""
from __future__ import annotations

import subprocess
import sys

LOADED = "import sys; print(sorted(m for m in sys.modules if m.startswith('healthsvc_client')))"


def loaded_after(statement: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"{statement}; {LOADED}"], capture_output=True, text=True,
                         check=True)
    return eval(out.stdout)  # noqa: S307 - our own print of a list of names


def test_the_wire_module_loads_alone():
    assert loaded_after("import healthsvc_client.wire") == ["healthsvc_client", "healthsvc_client.wire"]


def test_the_service_loads_the_wire_and_not_the_trainer_client():
    loaded = loaded_after("import healthsvc.app")
    assert "healthsvc_client.wire" in loaded and "healthsvc_client.client" not in loaded and "healthsvc_client.api" not in loaded


def test_the_run_api_is_still_one_import_away():
    loaded = loaded_after("import healthsvc_client as health; assert callable(health.init) and callable(health.log)")
    assert "healthsvc_client.client" in loaded and "healthsvc_client.api" in loaded


def test_the_package_names_are_the_run_api_not_the_submodules_of_the_same_name():
    for first in ("import healthsvc_client", "import healthsvc_client.client"):
        out = subprocess.run([sys.executable, "-c", f"{first}; import healthsvc_client; healthsvc_client.init\n"
                              "print(callable(healthsvc_client.stats))"], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "True", first
