"""Every notebook runs top to bottom (nbclient, the venv's own ``python3`` kernel) against a real
service holding the recorded run, and renders real plots. The service is started once, the
recording replayed into it at its original pace (the run's wall-clock views depend on it), and its
URL handed to the kernels through ``HEALTHSVC_URL``.

Each executed notebook is written to ``docs/notebooks/NAME.md`` with its figures in
``docs/img/notebooks/`` (``render.py``), so a reader of the repository sees the plots: commit them
after a run that changed them."""
from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from healthsvc.replay import RecordedRun, replay  # noqa: E402
from tests.notebooks.render import render  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
ALL = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The service with the recording in it, and the progress bar the replay drew meanwhile."""
    server = ServerProcess(tmp_path_factory.mktemp("notebooks") / "healthsvc.db").start()
    try:
        bar = io.StringIO()
        replay(RecordedRun.load(NOTEBOOKS / "data"), server.url, progress=bar)
        yield server.url, bar.getvalue()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def service_url(replayed):
    return replayed[0]


def test_the_replay_shows_its_progress_with_counts(replayed):
    recorded = RecordedRun.load(NOTEBOOKS / "data")
    records = recorded.metrics.num_rows
    steps = len(set(zip(recorded.metrics.column("attempt").to_pylist(), recorded.metrics.column("step").to_pylist())))
    draws = replayed[1].split("\r")[1:]
    assert len(draws) >= 3, draws          # redrawn while it ran (about a minute), not only at the end
    shown = [re.search(r"\] +(\d+)%  steps (\d+)/(\d+)  records (\d+)/(\d+)  (\d+) s of (\d+) s", d) for d in draws]
    assert all(shown), draws
    counts = [(int(m[4]), int(m[5])) for m in shown]
    assert [c for c, _ in counts] == sorted(c for c, _ in counts)            # it only moves forward
    assert {total for _, total in counts} == {records}
    last = shown[-1]
    assert draws[-1].endswith("\n") and last[1] == "100" and (int(last[2]), int(last[3])) == (steps, steps)
    assert int(last[4]) == records


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

    page = render(nb, name.removesuffix(".ipynb"))
    text = page.read_text()
    figures = re.findall(r"!\[[^]]*\]\((\.\./img/notebooks/[^)]+\.png)\)", text)
    assert len(figures) == len(images)
    for figure in figures:
        assert (page.parent / figure).read_bytes().startswith(b"\x89PNG")
