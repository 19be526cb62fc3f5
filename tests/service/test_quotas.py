"""Quotas on what a stranger can make the service hold (issue 25, findings 8 and 10): distinct metric
names per run (one push of 300,000 names cost 158 MiB; reading a step of a run with 200,000 took
minutes) and runs (2,000 one-record runs cost 190 MiB). A write beyond them changes nothing and
is answered 422 (names: the push is wrong) or 429 (runs: the service is full), naming the limit and
the setting; the counts survive a restart. Against a real server process, small limits."""
from __future__ import annotations

import httpx
import pytest

from tests.server_process import ServerProcess

pytestmark = pytest.mark.both_stores

MAX_NAMES = 8
MAX_RUNS = 3


def push(c: httpx.Client, run: str, step: int, names: list[str]) -> httpx.Response:
    return c.post(f"/v1/runs/{run}/metrics", json={"records": [{"step": step, "rank": 0, **{n: 1.0 for n in names}}]})


def steps(c: httpx.Client, run: str) -> list[int]:
    return c.get(f"/v1/runs/{run}/metrics").json()["columns"]["step"]


def test_metric_names_per_run_and_runs_are_capped_with_answers_that_say_which(tmp_path, db_uri):
    env = {"HEALTHSVC_MAX_METRIC_NAMES": str(MAX_NAMES), "HEALTHSVC_MAX_RUNS": str(MAX_RUNS)}
    first = [f"m{i}" for i in range(6)]
    more = ["x1", "x2", "x3"]                                 # 6 + 3 > 8
    with ServerProcess(db_uri, env=env, log_path=tmp_path / "server.log") as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        assert push(c, "r", 0, first).status_code == 202
        r = push(c, "r", 1, more)
        assert r.status_code == 422, r.text
        (item,) = r.json()["detail"]
        assert item["loc"] == ["body"]
        assert f"limit of {MAX_NAMES} per run (setting max_metric_names)" in item["msg"] and "'x1'" in item["msg"]
        assert "HEALTHSVC_MAX_METRIC_NAMES" in item["hint"]
        assert steps(c, "r") == [0]                           # nothing of it was stored
        assert push(c, "r", 1, more[:2]).status_code == 202    # 8 names: at the limit
        # One push with more names than a run may have is refused before it is parsed further.
        r = push(c, "other", 0, [f"n{i}" for i in range(MAX_NAMES + 1)])
        assert r.status_code == 422 and "max_metric_names" in r.json()["detail"][0]["msg"], r.text
        assert r.json()["detail"][0]["loc"] == ["body", "records", f"n{MAX_NAMES}"]

        for run in ("r2", "r3"):                               # runs r, r2, r3: the limit
            assert push(c, run, 0, ["loss"]).status_code == 202
        for answer in (push(c, "r4", 0, ["loss"]),
                       c.post("/v1/runs/r4/heartbeats", json={"rank": 0, "step": 0}),
                       c.put("/v1/runs/r4", json={"world_size": 2})):
            assert answer.status_code == 429, answer.text
            (item,) = answer.json()["detail"]
            assert item["loc"] == ["path", "run_id"]
            assert f"limit of {MAX_RUNS} runs (setting max_runs)" in item["msg"]
        assert c.get("/v1/runs/r4").status_code == 404       # no trace of the refused run
        assert push(c, "r2", 1, ["loss"]).status_code == 202  # existing runs go on

    with ServerProcess(db_uri, env=env, log_path=tmp_path / "server.log") as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        assert push(c, "r", 2, ["m0", "x1"]).status_code == 202      # known names
        assert push(c, "r", 3, ["y"]).status_code == 422             # the run still has 8
        assert push(c, "r5", 0, ["loss"]).status_code == 429         # and the service 3 runs
