"""Every notebook runs top to bottom (nbclient, the venv's own ``python3`` kernel) against a real
service holding the recorded run, and renders real plots. The service is started once, the
recording replayed into it at its original pace (the run's wall-clock views depend on it), and its
URL handed to the kernels through ``HEALTHSVC_URL``."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from healthsvc.replay import RecordedRun, replay  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
ALL = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture(scope="module")
def service_url(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("notebooks") / "healthsvc.db").start()
    try:
        replay(RecordedRun.load(NOTEBOOKS / "data"), server.url)
        yield server.url
    finally:
        server.stop()


def test_the_three_notebooks_are_there():
    assert ALL == ["checkpoint_policy.ipynb", "incident.ipynb", "run_overview.ipynb"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ALL)
def test_notebook_runs_top_to_bottom_and_draws(name, service_url, monkeypatch):
    monkeypatch.setenv("HEALTHSVC_URL", service_url)
    # The kernel is the venv's: "python" in the kernelspec resolves to this interpreter.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{name} drew no figure"
    assert all(cell.get("execution_count") for cell in nb.cells if cell.cell_type == "code")
