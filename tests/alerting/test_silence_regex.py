"""Silence matchers cannot backtrack catastrophically (issue 12, finding 6): RE2 matching."""
from __future__ import annotations

import json
import time

import httpx

from healthsvc.alerting.policy import Matcher
from tests.server_process import ServerProcess
from tests.alerting.receiver import Receiver

RUN = "a" * 40            # each extra character used to double the match time of (a+)+b


def test_a_backtracking_pattern_matches_in_linear_time():
    m = Matcher("run", "(a+)+b", "=~")
    started = time.perf_counter()
    assert not m.matches({"run": "a" * 100_000})
    assert time.perf_counter() - started < 0.5
    assert Matcher("run", "exp-.*", "=~").matches({"run": "exp-42"})
    assert not Matcher("run", "exp-.*", "=~").matches({"run": "xexp-42"})   # anchored


def test_a_pathological_silence_delays_neither_pages_nor_the_api(tmp_path):
    with Receiver() as rx:
        env = {"HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "oncall", "url": rx.url, "format": "json"}])}
        with ServerProcess(tmp_path / "s.db", env=env) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            refused = c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "(a)\\1", "op": "=~"}],
                                                   "duration_s": 3600})
            assert refused.status_code == 422 and "backreferences" in refused.text
            ok = c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "(a+)+b", "op": "=~"}],
                                              "duration_s": 3600})
            assert ok.status_code in (200, 201), ok.text
            # A backtracking matcher would take hours on this run id (2**40 steps), so a page
            # within 30 s (generous for a loaded CI machine) proves matching does not backtrack.
            body = {"records": [{"step": 0, "rank": 0, "loss": "NaN"}]}
            assert c.post(f"/v1/runs/{RUN}/metrics", json=body).status_code == 202
            rx.wait_for(1, timeout_s=30)
            started = time.monotonic()
            assert c.get("/v1/alerts").status_code == 200
            assert time.monotonic() - started < 10.0
