"""End to end through the per-host relay: examples/train.py's 4 gloo rank processes find the relay
by ``HEALTHSVC_RELAY`` (as a launcher would set it), a real ``python -m healthsvc_client.relay`` process
merges their pushes, a real server stores them. Every rank's every step arrives once, a NaN stays
NaN, the finding names its rank, and the service gets fewer metrics requests than the ranks made."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.test_relay import RelayProcess, counters

pytest.importorskip("torch")

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"


def test_four_rank_processes_through_one_relay(shared_server, shared_http, tmp_path):
    relay = RelayProcess(shared_server.url, interval_s=0.5)
    try:
        shared_http.put("/v1/runs/e2e-relay", json={"world_size": 4})
        before = counters(shared_server)
        cmd = [sys.executable, str(TRAIN), "--url", shared_server.url, "--run-id", "e2e-relay", "--log-every", "0",
               "--heartbeat-s", "0.5", "--ckpt-dir", str(tmp_path / "ckpt"), "--steps", "60",
               "--fault", "nan", "--fault-rank", "2", "--fault-step", "40"]
        result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                                env={**os.environ, "HEALTHSVC_RELAY": relay.socket})
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        summary = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"done"')][-1]
        assert summary["delivered"] and summary["client"]["relay_fallbacks"] == 0
        assert summary["client"]["relayed_requests"] > 0   # rank 0's own count: it went via the relay
        shared_http.drain()
        cols = shared_http.get("/v1/runs/e2e-relay/metrics", params={"fields": "loss"}).json()["columns"]
        assert sorted(zip(cols["step"], cols["rank"])) == [(s, r) for s in range(60) for r in range(4)]
        assert set(cols["attempt"]) == {1}
        loss = {(s, r): v for s, r, v in zip(cols["step"], cols["rank"], cols["loss"])}
        assert loss[(40, 2)] == "NaN" and isinstance(loss[(40, 1)], float)
        found = shared_http.get("/v1/runs/e2e-relay/findings").json()
        assert any(f["kind"] == "non_finite" and f["ranks"] == [2] and f["step"] == 40 for f in found)
        after = counters(shared_server)
        requests = sum(after[k] - before.get(k, 0) for k in after if k.startswith("healthsvc_ingest_requests_total{"))
        records = after["healthsvc_ingest_records_total"] - before.get("healthsvc_ingest_records_total", 0)
        assert records == 4 * 60
        said = relay.close().strip().splitlines()[-1]
        taken, pushes = map(int, re.fullmatch(r"stopped: merged (\d+) rank batches into (\d+) pushes .*", said).groups())
        # The relay merged: fewer pushes than the ranks handed it. The service saw those pushes plus
        # the batches holding step 40, which go direct (a page does not wait for the relay): rank
        # 2's NaN loss, and the NaN gradient norm every rank shares after the all-reduce.
        assert pushes < taken, said
        assert 1 <= requests - pushes <= 4, (requests, said)
    finally:
        relay.close()
