"""One knob, one name: the hang detector's floor is ``detectors.hang.timeout_floor_s``.

The old top-level ``hang_timeout_floor_s`` was silently overridden by the detector parameter; now
a new config that uses it is refused with a 422 saying where the knob went, while configs stored
before the rename (every one of them carries the key, most as null) keep their value and never
stop the service from starting.
"""
from __future__ import annotations

import json
import sqlite3


def test_the_old_name_is_refused_with_the_new_one_in_the_message(shared_http):
    r = shared_http.put("/v1/runs/knob-old", json={"world_size": 2, "hang_timeout_floor_s": 120})
    assert r.status_code == 422, r.text
    item = r.json()["detail"][0]
    assert item["loc"] == ["body", "hang_timeout_floor_s"]
    assert "detectors.hang.timeout_floor_s" in item["msg"]
    assert shared_http.get("/v1/runs/knob-old").status_code == 404   # nothing was stored


def test_the_new_name_is_the_only_one_shown(shared_http):
    r = shared_http.put("/v1/runs/knob-new", json={"world_size": 2, "detectors": {"hang": {"timeout_floor_s": 120}}})
    assert r.status_code == 200, r.text
    config = shared_http.get("/v1/runs/knob-new").json()["config"]
    assert "hang_timeout_floor_s" not in config
    assert config["detectors"] == {"hang": {"timeout_floor_s": 120}}
    schema = shared_http.get("/openapi.json").json()["components"]["schemas"]["RunConfig-Input"]["properties"]
    assert schema["hang_timeout_floor_s"]["deprecated"] is True


def test_a_config_stored_with_the_old_name_keeps_its_value_after_a_restart(server, http):
    for run in ("legacy", "both", "null"):
        assert http.put(f"/v1/runs/{run}", json={"world_size": 2}).status_code == 200
    server.stop()
    with sqlite3.connect(server.db_path) as db:   # what the previous version stored
        for run, config in (("legacy", {"world_size": 2, "hang_timeout_floor_s": 45.0, "detectors": {}}),
                            ("both", {"world_size": 2, "hang_timeout_floor_s": 45.0,
                                      "detectors": {"hang": {"timeout_floor_s": 90.0}}}),
                            ("null", {"world_size": 2, "hang_timeout_floor_s": None, "detectors": {}})):
            db.execute("UPDATE runs SET config=? WHERE run_id=?", (json.dumps(config), run))
    server.start()
    assert http.get("/readyz").status_code == 200
    shown = {run: http.get(f"/v1/runs/{run}").json() for run in ("legacy", "both", "null")}
    assert all(s["config_error"] is None for s in shown.values())
    assert shown["legacy"]["config"]["detectors"] == {"hang": {"timeout_floor_s": 45.0}}
    assert shown["both"]["config"]["detectors"] == {"hang": {"timeout_floor_s": 90.0}}   # it always won
    assert shown["null"]["config"]["detectors"] == {}


def test_the_monitor_builds_the_stored_floor_into_the_hang_detector():
    from healthsvc.monitor.suite import build_suite
    legacy = build_suite({"world_size": 2, "hang_timeout_floor_s": 45.0, "detectors": {}})
    assert legacy.absence["hang"].timeout_floor_s == 45.0
    both = build_suite({"hang_timeout_floor_s": 45.0, "detectors": {"hang": {"timeout_floor_s": 90.0}}})
    assert both.absence["hang"].timeout_floor_s == 90.0
