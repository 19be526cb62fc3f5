"""NaN, +Inf, -Inf and missing survive every path: rows and columns in (tokens and strings),
the store, a restart, JSON and CSV out. NaN is data; missing is not."""
from __future__ import annotations

import csv
import gzip
import io
import json
import math

import pytest

pytestmark = pytest.mark.both_stores

# rank -> value of "loss" at step 5; None = key absent/null (not reported).
EXPECTED = {0: 1.5, 1: math.nan, 2: math.inf, 3: -math.inf, 4: None}


def rows_body(token_style: str) -> bytes:
    records = []
    for rank, v in EXPECTED.items():
        rec = {"step": 5, "rank": rank, "grad_norm": 0.5}
        if v is not None:
            if token_style == "strings" and not math.isfinite(v):
                v = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
            rec["loss"] = v
        records.append(rec)
    # json.dumps writes NaN/Infinity/-Infinity tokens for float values.
    return json.dumps({"records": records}).encode()


def columns_body(token_style: str) -> bytes:
    loss = []
    for v in EXPECTED.values():
        if v is not None and not math.isfinite(v) and token_style == "strings":
            v = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        loss.append(v)
    cols = {"step": [5] * len(EXPECTED), "rank": list(EXPECTED), "loss": loss, "grad_norm": [0.5] * len(EXPECTED)}
    return json.dumps({"columns": cols}).encode()


def assert_json_loss(answer: dict, variant: str = "") -> None:
    cols = answer["columns"]
    got = dict(zip(cols["rank"], cols["loss"]))
    assert got == {0: 1.5, 1: "NaN", 2: "Infinity", 3: "-Infinity", 4: None}, variant
    assert cols["grad_norm"] == [0.5] * 5, variant


def assert_csv_loss(text: str, variant: str = "") -> None:
    rows = list(csv.DictReader(io.StringIO(text)))
    got = {int(r["rank"]): r["loss"] for r in rows}
    assert got == {0: "1.5", 1: "nan", 2: "inf", 3: "-inf", 4: ""}, variant


# Every way in: records or columns, JSON's non-finite tokens or strings, plain or gzipped.
VARIANTS = [(form, token_style, gzipped) for form in ("rows", "columns") for token_style in ("tokens", "strings")
            for gzipped in (False, True)]


def test_non_finite_and_missing_round_trip(server, http):
    """Each variant under a run of its own, read back as JSON and CSV; then one crash and restart
    for all of them (a server start is most of this test's cost: one, not one per variant)."""
    def read_back(run: str) -> None:
        assert_json_loss(http.get(f"/v1/runs/{run}/metrics").json(), run)
        assert_csv_loss(http.get(f"/v1/runs/{run}/metrics", params={"format": "csv"}).text, run)

    runs = []
    for form, token_style, gzipped in VARIANTS:
        run = f"rt-{form}-{token_style}-{'gzip' if gzipped else 'plain'}"
        body = rows_body(token_style) if form == "rows" else columns_body(token_style)
        headers = {"content-type": "application/json"}
        if gzipped:
            body = gzip.compress(body)
            headers["content-encoding"] = "gzip"
        r = http.post(f"/v1/runs/{run}/metrics", content=body, headers=headers)
        assert r.status_code == 202, (run, r.text)
        assert r.json()["accepted"] == 5, run
        read_back(run)
        runs.append(run)

    # Through a crash and restart: what is stored is what comes back.
    server.kill()
    server.start()
    for run in runs:
        read_back(run)


def test_field_filter_keeps_missing_distinct(http):
    body = {"records": [{"step": 1, "rank": 0, "loss": None, "lr": 0.1}, {"step": 1, "rank": 1, "loss": "NaN"}]}
    assert http.post("/v1/runs/f/metrics", content=json.dumps(body)).status_code == 202
    ans = http.get("/v1/runs/f/metrics", params={"fields": "loss"}).json()
    assert ans["fields"] == ["loss"]
    assert ans["columns"]["loss"] == [None, "NaN"]
    assert "lr" not in ans["columns"]
    ans = http.get("/v1/runs/f/metrics", params={"fields": "lr"}).json()
    assert ans["columns"]["lr"] == [0.1, None]


def test_arrow_export_keeps_nan_and_missing_apart(http):
    import pyarrow.ipc as ipc
    assert http.post("/v1/runs/ar/metrics", content=rows_body("tokens")).status_code == 202
    table = ipc.open_stream(http.get("/v1/runs/ar/metrics", params={"format": "arrow"}).content).read_all()
    got = dict(zip(table.column("rank").to_pylist(), table.column("loss").to_pylist()))
    assert got[0] == 1.5 and math.isnan(got[1]) and got[2] == math.inf and got[3] == -math.inf
    assert got[4] is None  # missing is null, not NaN


def test_framework_route_behaves_like_the_fast_path(tmp_path):
    """With the ASGI fast path off, the documented FastAPI route serves the same contract."""
    import httpx

    from tests.server_process import ServerProcess
    with ServerProcess(tmp_path / "slow.db", env={"HEALTHSVC_INGEST_FAST_PATH": "0"}) as server, \
            httpx.Client(base_url=server.url, headers={"content-type": "application/json"}) as http:
        r = http.post("/v1/runs/rt/metrics", content=rows_body("strings"))
        assert r.status_code == 202 and r.json() == {"accepted": 5, "duplicate": False, "attempt": 1}
        assert_json_loss(http.get("/v1/runs/rt/metrics").json())
        r = http.post("/v1/runs/rt/metrics", content=b'{"records": [{"step": -1, "rank": 0}]}')
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "records", 0, "step"]
