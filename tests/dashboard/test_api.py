"""The dashboard's JSON endpoints over HTTP: shapes, bad input, and surviving a restart."""
from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.both_stores

from tests.dashboard import browser, replay

RUN = "dash-api"


def push(http, steps=200):
    http.put(f"/v1/runs/{RUN}", json={"world_size": replay.N_RANKS}).raise_for_status()
    replay.push_steps(http, RUN, replay.make_trace(steps), 0, steps)


def series_len(http) -> int:
    s = http.get(f"/v1/runs/{RUN}/dashboard/series", params={"fields": "loss"}).json()
    return len(s["fields"].get("loss", {}).get("steps", []))


def test_series_and_heatmap_are_downsampled_and_survive_a_restart(server, http):
    push(http)
    browser.poll(lambda: series_len(http) == 200, what="the rollup to hold every step")
    s = http.get(f"/v1/runs/{RUN}/dashboard/series", params={"points": 50, "step_min": 20, "step_max": 119}).json()
    loss = s["fields"]["loss"]
    assert len(loss["steps"]) == 50 and loss["steps"][0] == 20 and loss["steps"][-1] == 119
    assert all(lo <= m <= hi for lo, m, hi in zip(loss["min"], loss["median"], loss["max"]))
    h = http.get(f"/v1/runs/{RUN}/dashboard/heatmap", params={"max_cols": 100},
                 headers={"accept-encoding": "gzip"})
    assert h.headers["content-encoding"] == "gzip"
    h = h.json()
    assert (h["n_rows"], h["n_cols"], h["step_width"]) == (replay.N_RANKS, 100, 2)
    assert h["hottest"]["rank_lo"] == replay.SLOW_RANK

    server.stop()   # a clean stop snapshots the rollup ...
    server.start()
    assert series_len(http) == 200
    server.kill()   # ... and a crash replays what the snapshot lacks
    with httpx.Client(base_url=server.url, timeout=30) as h2:
        server.start()
        replay.push_steps(h2, RUN, replay.make_trace(260), 200, 260)
        browser.poll(lambda: series_len(h2) == 260, what="steps after the crash")
        runs = h2.get("/v1/dashboard/runs").json()
        assert [(r["run_id"], r["health"]) for r in runs] == [(RUN, "critical")]


def test_bad_input_is_a_4xx_naming_the_field(http):
    push(http, steps=20)
    r = http.get(f"/v1/runs/{RUN}/dashboard/series", params={"fields": "loss,bogus"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "fields"]
    r = http.get(f"/v1/runs/{RUN}/dashboard/heatmap", params={"field": "loss"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "field"]
    r = http.get(f"/v1/runs/{RUN}/dashboard/series", params={"step_min": 10, "step_max": 5})
    assert r.status_code == 422 and "step_max" in r.json()["detail"][0]["msg"]
    assert http.get("/v1/runs/nope/dashboard/series").status_code == 404
    assert http.get("/v1/dashboard/runs/nope").status_code == 404


def test_documented_in_openapi_and_pages_served(http):
    paths = http.get("/openapi.json").json()["paths"]
    for p in ("/v1/dashboard/runs", "/v1/dashboard/runs/{run_id}", "/v1/runs/{run_id}/dashboard/series",
              "/v1/runs/{run_id}/dashboard/heatmap"):
        assert p in paths
    assert "/" not in paths
    for page in ("/", "/runs/anything"):
        r = http.get(page)
        assert r.status_code == 200 and "app.js" in r.text
    js = http.get("/dashboard/static/vendor/uPlot.iife.min.js")
    assert js.status_code == 200 and "uPlot" in js.text
