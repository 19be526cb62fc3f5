"""How far behind its input the run's owner judges: ``healthsvc_monitor_lag_seconds`` on /metrics.

Live, the detectors judge a push as it commits (the test's clock does not move: 0 s). A restart
(or a takeover: the same restore) replays what the detectors had not judged: the gauge then says
how old that data was, and the restore's log line too. Here a storage-only service stores a run's
steps; two minutes later the service restarts with its detectors and replays them.
"""
from __future__ import annotations

import json
import logging

from prometheus_client.parser import text_string_to_metric_families

from tests.harness import FakeClock, InProcessService


def lag(svc) -> float:
    families = {f.name: f for f in text_string_to_metric_families(svc.http.get("/metrics").text)}
    (sample,) = families["healthsvc_monitor_lag_seconds"].samples
    return sample.value


def push(svc, step: int) -> None:
    body = {"columns": {"step": [step, step], "rank": [0, 1], "loss": [2.0, 2.0]}}
    assert svc.http.post("/v1/runs/r/metrics", content=json.dumps(body)).status_code == 202


def test_the_lag_is_the_age_of_a_replayed_input_and_zero_live(tmp_path, caplog):
    clock = FakeClock()
    with InProcessService(tmp_path, clock=clock, detect=False) as svc:
        for step in range(5):
            push(svc, step)
        svc.drain()
    clock.advance(120.0)
    with caplog.at_level(logging.INFO, logger="healthsvc.monitor.hub"), \
            InProcessService(tmp_path, clock=clock) as svc:
        svc.drain()
        assert lag(svc) == 120.0
        assert any("replayed 5 chunks, the last 120.0 s after it arrived" in r.getMessage() for r in caplog.records)
        push(svc, 5)
        svc.drain()
        assert lag(svc) == 0.0
