"""tests/integrations/fsdp_train.py (FSDP2, 2 processes, gloo, CPU) against a real server: what a
sharded job sends arrives from every rank, and the shards' fingerprints, in one replica group per
rank, raise no replica_mismatch although they differ."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.torchrun import skip_unless_installed, torchrun

skip_unless_installed("torch")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_sharded_job_sends_every_field_from_every_rank(shared_server, shared_http, tmp_path):
    torchrun(Path(__file__).with_name("fsdp_train.py"), "--url", shared_server.url, "--run-id", "fsdp-1",
             "--ckpt-dir", str(tmp_path / "ckpt"), cwd=tmp_path)

    cols = shared_http.get("/v1/runs/fsdp-1/metrics").json()["columns"]
    by = {(s, r): i for i, (s, r) in enumerate(zip(cols["step"], cols["rank"]))}
    assert sorted(by) == [(s, r) for s in range(6) for r in (0, 1)]

    def val(field, step, rank):
        return cols[field][by[(step, rank)]]

    for s in range(6):
        assert val("loss", s, 0) != val("loss", s, 1)                        # each rank's own batch
        assert val("grad_norm", s, 0) > 0 and val("grad_norm", s, 0) == pytest.approx(val("grad_norm", s, 1), rel=1e-6)
        for r in (0, 1):
            assert val("lr", s, r) == pytest.approx(0.05 * (1 - 0.5 * s / 6))
            assert val("data_cursor", s, r) == 4 * (s + 1)
            assert val("comm_time", s, r) > 0 and val("compute_time", s, r) > 0
            assert val("step_time", s, r) >= val("compute_time", s, r) + val("comm_time", s, r) - 1e-6
    # Each rank's own shards: different digests, in different replica groups.
    assert [s for s in range(6) if val("param_digest", s, 0) is not None] == [1, 3, 5]
    for s in (1, 3, 5):
        assert val("param_digest", s, 0) != val("param_digest", s, 1)
        assert (val("replica_group", s, 0), val("replica_group", s, 1)) == (0, 1)
    shared_http.drain()
    assert shared_http.get("/v1/runs/fsdp-1/findings", params={"kind": "replica_mismatch"}).json() == []
    ckpts = shared_http.get("/v1/runs/fsdp-1/checkpoints").json()
    assert [c["step"] for c in ckpts] == [2, 5] and all(Path(c["uri"]).is_dir() for c in ckpts)
