"""The Lightning callback in a real 2-process DDP training (torchrun, gloo, CPU) against a real
server: per-rank ``local_grad_norm`` from before the all-reduce names the rank a NaN came from, and
ModelCheckpoint's saves are registered with their durations and sizes; every field arrives from
every rank; a resume mid-epoch, whose plain DataLoader starts the epoch's data again, is caught."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tests.integrations.torchrun import skip_unless_installed, torchrun

skip_unless_installed("lightning")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_local_grad_norm_names_the_nan_rank_and_checkpoints_carry_durations(shared_server, shared_http, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    _train(shared_server.url, "pl-ddp", ckpt_dir, tmp_path)

    cols = shared_http.get("/v1/runs/pl-ddp/metrics").json()["columns"]
    by = {(s, r): i for i, (s, r) in enumerate(zip(cols["step"], cols["rank"]))}
    assert sorted(by) == [(s, r) for s in range(6) for r in (0, 1)]
    # Every field, from every rank: 64 samples over 2 ranks in batches of 4, so after step s each
    # rank's sampler has yielded (s + 1) * 4 samples.
    for (step, rank), i in by.items():
        assert cols["data_cursor"][i] == (step + 1) * 4
        assert cols["lr"][i] == pytest.approx(0.05 * (1 - 0.05 * step))
        assert cols["step_time"][i] >= cols["compute_time"][i] > 0 and cols["data_time"][i] >= 0

    def val(field, step, rank):
        v = cols[field][by[(step, rank)]]
        return float(v) if isinstance(v, str) else v       # "NaN" travels as a string

    for step in range(3):
        l0, l1 = val("local_grad_norm", step, 0), val("local_grad_norm", step, 1)
        g0, g1 = val("grad_norm", step, 0), val("grad_norm", step, 1)
        assert l0 > 0 and l1 > 0 and l0 != l1                 # each rank's own gradients
        assert g0 == pytest.approx(g1, rel=1e-6)              # after the all-reduce: the same
        assert g0 <= (l0 + l1) / 2 * (1 + 1e-6)               # the norm of the mean <= the mean of norms
    assert math.isnan(val("local_grad_norm", 3, 1)) and math.isfinite(val("local_grad_norm", 3, 0))
    assert math.isnan(val("grad_norm", 3, 0)) and math.isnan(val("grad_norm", 3, 1))
    # Replica fingerprints every 2 steps (after the updates of steps 1, 3, 5): the two replicas
    # hold the same bits, even once the NaN update poisoned both alike.
    digests = {(s, r): cols["param_digest"][i] for (s, r), i in by.items()}
    assert [s for s in range(6) if digests[(s, 0)] is not None] == [1, 3, 5]
    assert all(digests[(s, 0)] == digests[(s, 1)] for s in (1, 3, 5))
    assert digests[(1, 0)] != digests[(3, 0)]   # the weights moved (to NaN: after that they stay put)

    findings = _wait_for(shared_http, "pl-ddp", "non_finite")
    assert shared_http.get("/v1/runs/pl-ddp/findings", params={"kind": "replica_mismatch"}).json() == []
    summary = [(f["metric"], f["step"], f["ranks"], f["evidence"]["role"]) for f in findings]
    # The first non-finite local values: rank 1's, at step 3 (rank 0's own go NaN at step 4, after
    # the poisoned update). (Which findings the detector adds as other ranks' pushes arrive is the
    # monitor's business, not the callback's.)
    assert ("local_grad_norm", 3, [1], "origin") in summary, summary
    assert min((step, ranks) for metric, step, ranks, _ in summary if metric == "local_grad_norm") == (3, [1])

    ckpts = shared_http.get("/v1/runs/pl-ddp/checkpoints").json()
    assert [c["step"] for c in ckpts] == [1, 3, 5]            # saved after 2, 4, 6 updates
    for c in ckpts:
        assert c["duration_s"] > 0 and c["bytes"] == os.path.getsize(c["uri"]) > 0
        assert Path(c["uri"]).parent == ckpt_dir


@pytest.mark.timeout(600)  # three trainings
def test_a_resume_mid_epoch_with_a_plain_dataloader_raises_resume_mismatch(shared_server, shared_http, tmp_path):
    """Lightning restores its loop counters from the checkpoint, but a plain ``DataLoader`` starts
    the epoch's samples again: the cursor the callback counts from the data goes back, and the
    service says so. A resume from the checkpoint at the end of the epoch continues the data."""
    run_id, ckpt_dir = "pl-resume", tmp_path / "ckpt"
    common = ("--steps", "10", "--nan-rank", "-1")
    _train(shared_server.url, run_id, ckpt_dir, tmp_path, *common)          # steps 0..9, 8 a epoch
    end_of_epoch = _checkpoint(shared_http, run_id, 7)
    _train(shared_server.url, run_id, ckpt_dir, tmp_path, *common, "--resume", end_of_epoch)  # 8, 9
    shared_http.drain()
    assert shared_http.get(f"/v1/runs/{run_id}").json()["attempt"] == 2
    assert shared_http.get(f"/v1/runs/{run_id}/findings", params={"kind": "resume_mismatch"}).json() == []

    _train(shared_server.url, run_id, ckpt_dir, tmp_path, *common, "--resume", _checkpoint(shared_http, run_id, 3))
    found = _wait_for(shared_http, run_id, "resume_mismatch")
    assert [(f["metric"], f["step"], f["evidence"]["expected"], f["evidence"]["got"]) for f in found] == [
        ("data_cursor", 4, 20, 4)]


def _train(url, run_id, ckpt_dir, cwd, *extra):
    torchrun(Path(__file__).with_name("lightning_ddp_train.py"), "--url", url, "--run-id", run_id,
             "--ckpt-dir", str(ckpt_dir), *extra, cwd=cwd)


def _checkpoint(http, run_id, step):
    """The URI of the run's checkpoint at ``step``, as the callback registered it."""
    return next(c["uri"] for c in http.get(f"/v1/runs/{run_id}/checkpoints").json() if c["step"] == step)


def _wait_for(http, run_id, kind):
    """The run's ``kind`` findings, once the service has processed all it was sent."""
    http.drain()
    items = http.get(f"/v1/runs/{run_id}/findings", params={"kind": kind}).json()
    assert items, f"no {kind} finding"
    return items
