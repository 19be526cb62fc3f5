"""Through the real server (uvicorn on 127.0.0.1, default settings, a fake clock): a NaN pushed
on 512 ranks at once pages once, signed."""
from __future__ import annotations

import json
import time

import httpx
import jsonschema
import pytest

from healthsvc.alerting.policy import DEFAULT_TIMINGS
from healthsvc.alerting.signing import generate_secret, verify
from tests.alerting.amschema import ALERTMANAGER_V4
from tests.alerting.receiver import Receiver
from tests.harness import ServedService

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

WORLD = 512


def records(step, loss):
    return {"columns": {"step": [step] * WORLD, "rank": list(range(WORLD)), "loss": [loss] * WORLD,
                        "grad_norm": [1.0] * WORLD, "step_time": [0.5] * WORLD,
                        "host": [f"node{r // 8}" for r in range(WORLD)]}}


def test_nan_pushed_on_512_ranks_is_one_notification(tmp_path):
    secret = generate_secret()
    with Receiver() as rx:
        webhooks = [{"id": "am", "url": rx.url, "format": "alertmanager", "secret": secret}]
        with ServedService(tmp_path, alert_webhooks=webhooks) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            assert c.put("/v1/runs/big", json={"world_size": WORLD}).status_code == 200
            for step in range(20):
                assert c.post("/v1/runs/big/metrics", json=records(step, 2.0 - 0.01 * step)).status_code == 202
            assert c.post("/v1/runs/big/metrics", json=records(20, "NaN")).status_code == 202
            srv.drain()   # every finding, alert and delivery the pushes caused (critical: group_wait 0)
            (got,) = rx.delivered()
            # Through a group interval (the aligner's waits included): nothing more to say.
            srv.advance(DEFAULT_TIMINGS["critical"].group_interval_s)
            assert len(rx.requests) == 1
            verify(secret, got.headers, got.body, now=time.time())
            body = json.loads(got.body)
            jsonschema.validate(body, ALERTMANAGER_V4)
            assert body["groupKey"] == '{}:{run="big"}'
            names = {a["labels"]["alertname"] for a in body["alerts"]}
            assert names == {"non_finite"}
            (alert,) = body["alerts"]   # one alert for the rank set, the 512 ranks in its annotations
            assert alert["labels"]["rank"] == "0-511"
            assert (alert["annotations"]["ranks"], alert["annotations"]["rank_count"]) == ("0-511", str(WORLD))
            alerts = c.get("/v1/alerts", params={"run": "big"}).json()["alerts"]
            assert {a["kind"] for a in alerts} == {"non_finite"}
