"""Bad input gets a clear 4xx naming the field, never a 500, and changes nothing."""
from __future__ import annotations

import gzip
import json

import pytest

pytestmark = pytest.mark.both_stores
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GOOD = {"records": [{"step": 1, "rank": 0, "loss": 1.0}]}


def stored(http, run="bad"):
    r = http.get(f"/v1/runs/{run}/metrics")
    return r.json()["columns"] if r.status_code == 200 else None


@pytest.mark.parametrize("body, status, loc", [
    (b"{not json", 400, ["body"]),
    (b"", 400, ["body"]),
    (b"[1, 2]", 422, ["body"]),
    (b'{"records": [{"step": 1, "rank": 0}], "extra": 1}', 422, ["body", "extra"]),
    (b'{"records": [], "columns": {}}', 422, ["body"]),
    (b'{"records": {"step": 1}}', 422, ["body", "records"]),
    (b'{"records": [5]}', 422, ["body", "records", 0]),
    (b'{"records": [{"rank": 0, "loss": 1}]}', 422, ["body", "records", "step"]),
    (b'{"records": [{"step": -1, "rank": 0}]}', 422, ["body", "records", 0, "step"]),
    (b'{"records": [{"step": 1, "rank": -3}]}', 422, ["body", "records", 0, "rank"]),
    (b'{"records": [{"step": 1.5, "rank": 0}]}', 422, ["body", "records", 0, "step"]),
    (b'{"records": [{"step": "1", "rank": 0}]}', 422, ["body", "records", 0, "step"]),
    (b'{"records": [{"step": 1, "rank": 0, "loss": "high"}]}', 422, ["body", "records", 0, "loss"]),
    (b'{"records": [{"step": 1, "rank": 0, "loss": true}]}', 422, ["body", "records", 0, "loss"]),
    (b'{"records": [{"step": 1, "rank": 0, "loss": [1]}]}', 422, ["body", "records", 0, "loss"]),
    (b'{"records": [{"step": 1, "rank": 0, "host": 7}]}', 422, ["body", "records", 0, "host"]),
    (b'{"records": [{"step": 1, "rank": 0, "attempt": 2}]}', 422, ["body", "records", "attempt"]),
    (b'{"records": [{"step": 1, "rank": 0, "param_digest": 7}]}', 422, ["body", "records", 0, "param_digest"]),
    (b'{"records": [{"step": 1, "rank": 0, "param_digest": ""}]}', 422, ["body", "records", 0, "param_digest"]),
    (b'{"records": [{"step": 1, "rank": 0, "param_digest": "' + b"f" * 129 + b'"}]}', 422,
     ["body", "records", 0, "param_digest"]),
    (b'{"records": [{"step": 1, "rank": 0, "replica_group": 1.5}]}', 422, ["body", "records", 0, "replica_group"]),
    (b'{"records": [{"step": 1, "rank": 0, "replica_group": -1}]}', 422, ["body", "records", 0, "replica_group"]),
    (b'{"columns": {"step": [1], "rank": [0], "data_cursor": ["NaN"]}}', 422, ["body", "columns", "data_cursor", 0]),
    # 2**53 + 1 would be stored as 2**53 (float64): refused, not rounded (issue 25)
    (b'{"records": [{"step": 1, "rank": 0, "data_cursor": 9007199254740993}]}', 422,
     ["body", "records", 0, "data_cursor"]),
    (b'{"columns": {"step": [1, 1], "rank": [0, 1], "data_cursor": [3, 9007199254740993]}}', 422,
     ["body", "columns", "data_cursor", 1]),
    (b'{"records": [{"step": 1, "rank": 0, "replica_group": 18446744073709551615}]}', 422,
     ["body", "records", 0, "replica_group"]),
    (b'{"records": [{"step": 1, "rank": 0}, {"step": 1, "rank": 0}]}', 422, ["body", "records", 1, "step"]),
    (b'{"columns": {"step": [1, 2], "rank": [0]}}', 422, ["body", "columns", "rank"]),
    (b'{"columns": {"step": [1], "rank": [0], "loss": 3}}', 422, ["body", "columns", "loss"]),
    (b'{"columns": {"step": [1], "rank": [0], "loss": [1e999999]}}', None, None),  # json reads inf: accepted
    (b'{"columns": {"step": [1], "rank": [0], "bad name": [1]}}', 422, ["body", "columns", "bad name"]),
    (b'{"columns": {"step": [99999999999999999999999], "rank": [0]}}', 422, ["body", "columns", "step", 0]),
])
def test_rejections_name_the_field(shared_http, body, status, loc):
    before = stored(shared_http)
    r = shared_http.post("/v1/runs/bad/metrics", content=body, headers={"content-type": "application/json"})
    if status is None:
        assert r.status_code == 202
        return
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert detail[0]["loc"] == loc and detail[0]["msg"]
    assert stored(shared_http) == before


def test_oversized_and_bad_gzip(tmp_path):
    from tests.server_process import ServerProcess
    import httpx
    with ServerProcess(tmp_path / "small.db", env={"HEALTHSVC_MAX_BODY_BYTES": "4096"}) as server, \
            httpx.Client(base_url=server.url, headers={"content-type": "application/json"}) as http:
        assert http.post("/v1/runs/z/metrics", json=GOOD).status_code == 202
        big = {"records": [{"step": i, "rank": 0, "loss": 1.0} for i in range(500)]}
        r = http.post("/v1/runs/z/metrics", json=big)
        assert r.status_code == 413 and "limit" in r.json()["detail"][0]["msg"]
        # A small gzip body that inflates past the limit is refused too (no zip bombs).
        bomb = gzip.compress(json.dumps(big).encode())
        assert len(bomb) < 4096
        r = http.post("/v1/runs/z/metrics", content=bomb, headers={"content-encoding": "gzip"})
        assert r.status_code == 413
        r = http.post("/v1/runs/z/metrics", content=b"not gzip", headers={"content-encoding": "gzip"})
        assert r.status_code == 400 and "gzip" in r.json()["detail"][0]["msg"]
        r = http.post("/v1/runs/z/metrics", content=b"{}", headers={"content-encoding": "br"})
        assert r.status_code == 400
        # Chunked upload without Content-Length over the limit.
        r = http.post("/v1/runs/z/metrics", content=iter([json.dumps(big).encode()]))
        assert r.status_code == 413
        assert len(http.get("/v1/runs/z/metrics").json()["columns"]["step"]) == 1


def test_other_endpoints_validate(shared_http):
    r = shared_http.post("/v1/runs/v/checkpoints", json={"step": -1, "uri": "x"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "step"]
    r = shared_http.post("/v1/runs/v/heartbeats", json={"rank": 0, "phase": "dancing"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "phase"]
    r = shared_http.post("/v1/runs/v/events", json={"kind": "explosion"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "kind"]
    r = shared_http.post("/v1/runs/v/checkpoints", content=b"{oops", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = shared_http.put("/v1/runs/v", json={"world_size": 0})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "world_size"]
    r = shared_http.put("/v1/runs/v", json={"detectors": {"nope": {}}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "detectors", "nope"]
    assert shared_http.get("/v1/runs/does-not-exist").status_code == 404
    assert shared_http.get("/v1/runs/bad%20id/metrics").status_code == 422
    r = shared_http.get("/v1/runs/v/metrics", params={"ranks": "a,b"})
    assert r.status_code in (404, 422)


# -- property: arbitrary JSON never produces a 500, and a rejected batch changes nothing --------
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                      st.text(max_size=8), st.sampled_from(["NaN", "Infinity", "-Infinity"]))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4) |
                          st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
field_names = st.sampled_from(["step", "rank", "loss", "grad_norm", "host", "attempt", "x.y", "", "batch_id"])
record = st.dictionaries(field_names, json_value, max_size=6)
bodies = st.one_of(
    json_value.map(lambda v: v),
    st.builds(lambda recs: {"records": recs}, st.lists(record, max_size=5)),
    st.builds(lambda cols: {"columns": cols}, st.dictionaries(field_names, st.lists(json_leaf, max_size=4), max_size=5)),
    st.builds(lambda recs, bid: {"records": recs, "batch_id": bid}, st.lists(record, max_size=3), json_leaf),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_fuzz_never_500_and_rejections_change_nothing(shared_http, body):
    before = stored(shared_http, "fuzz")
    payload = json.dumps(body, allow_nan=True).encode()
    r = shared_http.post("/v1/runs/fuzz/metrics", content=payload, headers={"content-type": "application/json"})
    assert r.status_code in (202, 400, 413, 422), (r.status_code, r.text, payload[:200])
    if r.status_code != 202:
        assert r.json()["detail"][0]["msg"]
        assert stored(shared_http, "fuzz") == before


def test_an_integer_field_is_exact_up_to_its_documented_maximum(shared_http):
    """2**53 itself is accepted and read back exactly; one above it is a 422 naming the field."""
    top = 2**53
    body = {"records": [{"step": 1, "rank": 0, "data_cursor": top}]}
    assert shared_http.post("/v1/runs/exact/metrics", json=body).status_code == 202
    assert shared_http.get("/v1/runs/exact/metrics").json()["columns"]["data_cursor"] == [top]
    r = shared_http.post("/v1/runs/exact/metrics", json={"records": [{"step": 2, "rank": 0, "data_cursor": top + 1}]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "records", 0, "data_cursor"]
    assert "2**53" in r.json()["detail"][0]["msg"]
