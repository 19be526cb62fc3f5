"""The analyst read API against a real server: NaN and missing survive the whole trip
(client -> ingest -> store -> API -> DataFrame) apart, column types, filters, wide layout."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

pytestmark = pytest.mark.both_stores

from healthsvc_client import read
from healthsvc_client.read import Reader, ReadError

NAN, INF = float("nan"), float("inf")

# (step, rank) -> loss as pushed; None = not reported. Python's json writes NaN/Infinity tokens.
LOSS = {(0, 0): 1.0, (0, 1): NAN, (1, 0): INF, (1, 1): None, (2, 0): -INF, (2, 1): 2.5}


def _rows(host: bool = True) -> list[dict]:
    rows = []
    for (step, rank), loss in LOSS.items():
        row = {"step": step, "rank": rank, "grad_norm": 0.5 + step}
        if loss is not None:
            row["loss"] = loss
        if host and rank == 0:
            row["host"] = "node-a"
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def reader(shared_server, shared_http) -> Reader:
    body = json.dumps({"records": _rows()})  # allow_nan: NaN/Infinity tokens on the wire
    r = shared_http.post("/v1/runs/nan-trip/metrics", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 202, r.text
    return Reader(shared_server.url)


def _loss_cell(df: pd.DataFrame, step: int, rank: int):
    row = df[(df.step == step) & (df["rank"] == rank)]
    assert len(row) == 1
    return row["loss"].iloc[0]


@pytest.mark.parametrize("fmt", ["arrow", "csv"])
def test_nan_inf_and_missing_come_back_exactly(reader, fmt):
    df = reader.metrics("nan-trip", format=fmt)
    assert list(zip(df.step, df["rank"])) == sorted(LOSS)
    for (step, rank), sent in LOSS.items():
        got = _loss_cell(df, step, rank)
        if sent is None:
            assert got is pd.NA, (step, rank, got)
        elif math.isnan(sent):
            assert got is not pd.NA and math.isnan(got), (step, rank, got)
        else:
            assert got == sent, (step, rank, got)
    # isna() means "not reported", never "NaN".
    assert df["loss"].isna().tolist() == [LOSS[k] is None for k in sorted(LOSS)]


def test_column_types(reader):
    df = reader.metrics("nan-trip")
    assert list(df.columns[:4]) == ["step", "rank", "attempt", "host"]
    assert {c: str(df[c].dtype) for c in ("step", "rank", "attempt")} == {c: "int64" for c in ("step", "rank", "attempt")}
    assert isinstance(df["host"].dtype, pd.StringDtype)
    assert df["host"].isna().tolist() == [False, True] * 3 and set(df["host"].dropna()) == {"node-a"}
    assert df["loss"].dtype == pd.ArrowDtype(pa.float64()) and df["grad_norm"].dtype == pd.ArrowDtype(pa.float64())
    assert df["attempt"].tolist() == [1] * 6
    # a plain float array for plotting: NaN and NA both NaN there, infinities kept.
    arr = df["loss"].to_numpy(dtype=float, na_value=np.nan)
    assert arr.dtype == np.float64 and np.isinf(arr).sum() == 2


def test_csv_fallback_types(reader):
    df = reader.metrics("nan-trip", format="csv")
    assert str(df["step"].dtype) == "int64" and str(df["loss"].dtype) == "Float64"


def test_filters_steps_ranks_fields(reader):
    df = reader.metrics("nan-trip", steps=(1, 2), ranks=[1], fields=["grad_norm"])
    assert df.step.tolist() == [1, 2] and df["rank"].tolist() == [1, 1]
    assert [c for c in df.columns if c not in ("step", "rank", "attempt", "host")] == ["grad_norm"]
    assert df.grad_norm.tolist() == [1.5, 2.5]
    one = reader.metrics("nan-trip", steps=2)
    assert one.step.tolist() == [2, 2]


def test_wide_layout_keeps_nan_and_missing_apart(reader):
    wide = reader.metrics("nan-trip", fields=["loss", "grad_norm"], layout="wide")
    assert wide.index.tolist() == [0, 1, 2] and wide.columns.names == ["field", "rank"]
    loss = wide["loss"]
    assert loss.loc[1, 1] is pd.NA and math.isnan(loss.loc[0, 1]) and loss.loc[1, 0] == INF
    assert wide["grad_norm"][0].tolist() == [0.5, 1.5, 2.5]


def test_attempts_are_kept_and_selectable(shared_server, shared_http):
    run = "attempts-read"
    first = {"columns": {"step": [0, 1, 2, 0, 1, 2], "rank": [0, 0, 0, 1, 1, 1], "loss": [3.0, 2.0, 1.0] * 2}}
    again = {"columns": {"step": [1, 2, 1, 2], "rank": [0, 0, 1, 1], "loss": [9.0, 8.0, 9.0, 8.0]}}
    for body in (first, again):
        assert shared_http.post(f"/v1/runs/{run}/metrics", json=body).status_code == 202
    r = Reader(shared_server.url)
    eff = r.metrics(run, ranks=[0])
    assert eff.attempt.tolist() == [1, 2, 2] and eff.loss.tolist() == [3.0, 9.0, 8.0]
    old = r.metrics(run, ranks=[0], attempt=1)
    assert old.loss.tolist() == [3.0, 2.0, 1.0]


def test_findings_checkpoints_events_timeline_frames(shared_server, shared_http):
    run = "frames-read"
    assert shared_http.post(f"/v1/runs/{run}/metrics", json={"records": [{"step": 0, "rank": 0, "loss": 1.0}]}).status_code == 202
    assert shared_http.post(f"/v1/runs/{run}/checkpoints", json={"step": 0, "uri": "file:///c0", "duration_s": 2.0}).status_code == 201
    assert shared_http.post(f"/v1/runs/{run}/events", json={"kind": "note", "step": 0, "data": {"reason": "x"}}).status_code == 201
    r = Reader(shared_server.url)
    ck = r.checkpoints(run)
    assert ck[["step", "uri", "duration_s"]].values.tolist() == [[0, "file:///c0", 2.0]]
    assert r.events(run)[["kind", "step"]].values.tolist() == [["note", 0]]
    f = r.findings(run)
    assert len(f) == 0 and "onset_step" in f.columns and "kind" in f.columns
    tl = r.timeline(run)
    assert "checkpoint" in tl.kind.tolist() and str(tl["step"].dtype) == "Int64"
    assert run in r.runs().run_id.tolist()
    assert read.run(run, url=shared_server.url)["run_id"] == run


def test_module_functions_read_the_url_from_the_environment(shared_server, monkeypatch):
    monkeypatch.setenv("HEALTHSVC_URL", shared_server.url)
    assert "nan-trip" in read.runs().run_id.tolist()
    df = read.metrics("nan-trip", fields=["loss"])
    assert len(df) == 6


def test_errors_name_the_problem(shared_server):
    r = Reader(shared_server.url)
    with pytest.raises(ReadError) as err:
        r.metrics("no-such-run")
    assert err.value.status == 404 and "no-such-run" in str(err.value)
    with pytest.raises(ReadError) as err:
        r.metrics("nan-trip", fields=["nope"])
    assert err.value.status == 422 and "nope" in str(err.value)
    with pytest.raises(ReadError, match="cannot reach"):
        Reader("http://127.0.0.1:9", timeout_s=2).runs()


def test_importing_the_read_api_imports_no_pandas():
    code = "import sys, healthsvc_client, healthsvc_client.read; print(sorted(m for m in ('pandas', 'numpy', 'pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_all_attempts_in_one_frame(shared_server, shared_http):
    run = "attempts-all"
    for body in ({"columns": {"step": [0, 1, 2], "rank": [0, 0, 0], "loss": [3.0, 2.0, 1.0]}},
                 {"columns": {"step": [1, 2], "rank": [0, 0], "loss": [9.0, 8.0]}}):
        assert shared_http.post(f"/v1/runs/{run}/metrics", json=body).status_code == 202
    r = Reader(shared_server.url)
    df = r.metrics(run, attempt="all")
    assert list(zip(df.attempt, df.step, df.loss)) == [(1, 0, 3.0), (1, 1, 2.0), (1, 2, 1.0), (2, 1, 9.0), (2, 2, 8.0)]
    with pytest.raises(ValueError, match="long"):
        r.metrics(run, attempt="all", layout="wide")
