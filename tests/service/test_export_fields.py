"""Reading a run back names each field once, whatever the query repeats (found by probing the
Arrow/CSV export: ``fields=loss,loss`` gave two columns, the second one partly empty)."""
from __future__ import annotations

import io
import json

import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pytest

pytestmark = pytest.mark.both_stores


def test_a_field_named_twice_is_one_column_in_every_format(http):
    body = {"records": [{"step": 1, "rank": 0, "loss": 1.0}, {"step": 2, "rank": 0, "loss": "NaN"},
                        {"step": 3, "rank": 1, "loss": None, "lr": 0.1}]}
    assert http.post("/v1/runs/dup/metrics", content=json.dumps(body),
                     headers={"content-type": "application/json"}).status_code == 202
    arrow = ipc.open_stream(io.BytesIO(http.get("/v1/runs/dup/metrics?format=arrow&fields=loss,lr,loss").content)).read_all()
    assert arrow.column_names == ["step", "rank", "attempt", "loss", "lr"]
    loss = arrow.column("loss").to_pylist()
    assert loss[0] == 1.0 and loss[1] != loss[1] and loss[2] is None      # value, NaN, missing
    csv = pacsv.read_csv(io.BytesIO(http.get("/v1/runs/dup/metrics?format=csv&fields=loss,loss").content))
    assert csv.column_names == ["step", "rank", "attempt", "loss"]
    js = http.get("/v1/runs/dup/metrics?fields=loss,loss").json()
    assert js["fields"] == ["loss"] and js["columns"]["loss"] == [1.0, "NaN", None]
