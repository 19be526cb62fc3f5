"""examples/accelerate_train.py, run as its docstring says (torchrun or accelerate launch, 2
processes, gloo, CPU),
against a real server: every process reports every field (its own loss and pre-all-reduce gradient
norm, the global norm, lr, the data position, step times, fingerprints), the main process registers
the checkpoints with their durations, and a resume that starts the epoch's data again is caught."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.torchrun import ROOT, skip_unless_installed, torchrun

skip_unless_installed("accelerate")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EXAMPLE = ROOT / "examples" / "accelerate_train.py"
STEPS = 12   # 256 samples, 16 a batch, 2 processes: an epoch is 8 steps, so this resumes across one


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate launch"])
def test_the_accelerate_example_reports_every_field_from_every_process(shared_server, shared_http, tmp_path,
                                                                        launcher):
    assert {"torchrun": "torchrun --nproc_per_node 2 examples/accelerate_train.py --url",
            "accelerate launch": "accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py --url",
            }[launcher] in EXAMPLE.read_text()
    run_id = "acc-" + launcher.replace(" ", "-")
    _train(shared_server.url, run_id, tmp_path, launcher=launcher)

    cols = shared_http.get(f"/v1/runs/{run_id}/metrics").json()["columns"]
    by = {(s, r): i for i, (s, r) in enumerate(zip(cols["step"], cols["rank"]))}
    assert sorted(by) == [(s, r) for s in range(STEPS) for r in (0, 1)]

    def val(field, step, rank):
        return cols[field][by[(step, rank)]]

    for s in range(STEPS):
        assert val("loss", s, 0) != val("loss", s, 1)                     # each process's own batch
        l0, l1, g0, g1 = (val(f, s, r) for f in ("local_grad_norm", "grad_norm") for r in (0, 1))
        assert l0 != l1 and g0 == pytest.approx(g1, rel=1e-6)             # all-reduced: the same
        assert g0 <= (l0 + l1) / 2 * (1 + 1e-6)
        for r in (0, 1):
            assert val("lr", s, r) == pytest.approx(0.05 * (1 - 0.9 * s / STEPS))
            assert val("data_cursor", s, r) == 16 * (s + 1)
            assert val("step_time", s, r) >= val("compute_time", s, r) + val("data_time", s, r) - 1e-6
            assert val("compute_time", s, r) > 0
    assert [s for s in range(STEPS) if val("param_digest", s, 0) is not None] == [3, 7, 11]
    assert all(val("param_digest", s, 0) == val("param_digest", s, 1) for s in (3, 7, 11))
    ckpts = shared_http.get(f"/v1/runs/{run_id}/checkpoints").json()
    assert [c["step"] for c in ckpts] == [3, 7, 11]
    assert all(c["duration_s"] > 0 and Path(c["uri"]).is_dir() for c in ckpts)


@pytest.mark.timeout(600)  # three trainings
def test_a_resume_that_does_not_skip_the_trained_batches_raises_resume_mismatch(shared_server, shared_http,
                                                                                 tmp_path):
    run_id, step3 = "acc-resume", str(tmp_path / "ckpt" / "step3")
    _train(shared_server.url, run_id, tmp_path)                       # steps 0..11
    _train(shared_server.url, run_id, tmp_path, "--resume", step3)    # 4..11, the data skipped to
    shared_http.drain()
    assert shared_http.get(f"/v1/runs/{run_id}").json()["attempt"] == 2
    assert shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "resume_mismatch"}).json() == []

    _train(shared_server.url, run_id, tmp_path, "--resume", step3, "--reset-sampler")
    shared_http.drain()
    found = shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "resume_mismatch"}).json()
    assert [(f["metric"], f["step"], f["evidence"]["expected"], f["evidence"]["got"]) for f in found] == [
        ("data_cursor", 4, 80, 16)]


def _train(url, run_id, tmp_path, *extra, launcher="torchrun"):
    torchrun(EXAMPLE, "--url", url, "--run-id", run_id, "--steps", str(STEPS), "--ckpt-dir",
             str(tmp_path / "ckpt"), *extra, cwd=tmp_path, launcher=launcher)
