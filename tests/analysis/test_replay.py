"""A recorded run replayed into a fresh service comes back the same: the history of every attempt
(NaN and missing apart), the attempts themselves, checkpoints and events."""
from __future__ import annotations

import json
import time

import pandas as pd
import pytest

from healthsvc_client.read import Reader
from healthsvc.replay import RecordedRun, export_run, replay
from tests.server_process import ServerProcess

RUN = "rec-small"


def _post(http, path, body):
    r = http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code in (201, 202), r.text


@pytest.fixture(scope="module")
def recorded(shared_server, shared_http, tmp_path_factory) -> RecordedRun:
    """Attempt 1: steps 0..5 on 2 ranks (a NaN, an Inf, a missing value); checkpoint at 3;
    attempt 2 resumes at step 4 after a rollback event."""
    # The trainer's clock (``ts``) is the time of each push, as a real trainer's is: the recording
    # keeps the order things were sent in however fast this machine is (the service stamps the
    # event with its own clock).
    http = shared_http
    assert http.put(f"/v1/runs/{RUN}", json={"world_size": 2, "batch_size_per_rank": 4}).status_code == 200
    for step in range(6):
        loss = {1: "NaN", 2: "Infinity"}.get(step, 3.0 - 0.1 * step)
        t = time.time()
        rows = [{"step": step, "rank": 0, "loss": loss, "grad_norm": 1.0, "ts": t, "host": "a"},
                {"step": step, "rank": 1, "grad_norm": 1.0, "ts": t + 0.001, "host": "b",
                 **({"loss": 2.0} if step != 4 else {})}]
        _post(http, f"/v1/runs/{RUN}/metrics", {"records": rows})
        if step == 3:
            _post(http, f"/v1/runs/{RUN}/checkpoints", {"step": 3, "uri": "file:///c3", "duration_s": 0.5, "bytes": 10})
    _post(http, f"/v1/runs/{RUN}/events", {"kind": "rollback", "step": 3, "data": {"reason": "test"}})
    for step in (4, 5, 6):
        t = time.time()
        rows = [{"step": step, "rank": r, "loss": 1.5, "grad_norm": 0.9, "ts": t} for r in (0, 1)]
        _post(http, f"/v1/runs/{RUN}/metrics", {"records": rows})
    finished_at = time.time() + 0.01
    out = export_run(shared_server.url, RUN, tmp_path_factory.mktemp("rec"),
                     {"launches": [{"fault": {"kind": "corrupt_grad", "rank": 0, "step": 2}, "finished": True,
                                    "finished_at": finished_at}]})
    return RecordedRun.load(out)


def test_export_holds_every_attempt(recorded):
    assert recorded.metrics.num_rows == 12 + 6
    assert sorted(set(recorded.metrics.column("attempt").to_pylist())) == [1, 2]
    assert [c["step"] for c in recorded.checkpoints] == [3]
    assert [(e["kind"], e["step"]) for e in recorded.events] == [("rollback", 3)]
    assert recorded.corruption_onset() == 2
    assert recorded.ground_truth_probe(1, "x") and not recorded.ground_truth_probe(2, "x")


def test_batches_never_split_a_step(recorded):
    batches = [a.body for a in recorded.actions(batch_s=10.0) if a.kind == "metrics"]
    # attempt 1 and attempt 2 in separate batches, whole steps in each
    assert [sorted(set(b["step"])) for b in batches] == [[0, 1, 2, 3, 4, 5], [4, 5, 6]]
    kinds = [a.kind for a in recorded.actions(batch_s=0.0)]
    assert kinds.index("event") < len(kinds) - 1 and kinds[-1] == "finish"


def test_replay_reproduces_history_attempts_checkpoints_events(recorded, shared_server, tmp_path):
    with ServerProcess(tmp_path / "replay.db") as target:
        replay(recorded, target.url, run_id="copy", speed=20.0, settle_s=0.5)
        src, dst = Reader(shared_server.url), Reader(target.url)
        for attempt in (1, 2):
            a = src.metrics(RUN, attempt=attempt).drop(columns=["ts"])
            b = dst.metrics("copy", attempt=attempt).drop(columns=["ts"])
            pd.testing.assert_frame_equal(a, b)
        a, b = src.metrics(RUN), dst.metrics("copy")
        assert b["loss"].isna().tolist() == a["loss"].isna().tolist()
        assert [x["attempt"] for x in dst.run("copy")["attempts"]] == [1, 2]
        assert dst.run("copy")["status"] == "finished"
        assert dst.checkpoints("copy")[["step", "uri", "duration_s", "bytes"]].values.tolist() == [[3, "file:///c3", 0.5, 10]]
        assert dst.events("copy")[["kind", "step"]].values.tolist() == [["rollback", 3]]
        assert dst.run("copy")["config"]["batch_size_per_rank"] == 4

