"""Pushes accepted by a replica that does not own the run reach the owner's detectors whole: a
small push in the notification itself, a big one read from the store by id; either way the owner
finds the NaN at its step and rank (NaN stays NaN, not missing, through both ways).

Two replicas on one fresh PostgreSQL database, addressed directly (no balancer): the run's first
push goes to ``a``, which claims it; everything after goes to ``b``."""
from __future__ import annotations

import json

import httpx
import pytest

from healthsvc.ownership.remote_chunks import INLINE_RECORDS
from tests.barriers import wait_until
from tests.pg import fresh_database
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e

BIG = INLINE_RECORDS + 36     # records in one push: beyond what travels inline
JSON = {"content-type": "application/json"}


def columns(step: int, ranks: list[int], nan_rank: int | None = None) -> bytes:
    """A columnar push (JSON with a bare NaN, as the clients send it)."""
    return json.dumps({"columns": {"step": [step] * len(ranks), "rank": ranks,
                                   "loss": [float("nan") if r == nan_rank else 1.0 for r in ranks],
                                   "grad_norm": [1.0] * len(ranks)}}).encode()


def test_a_nan_pushed_to_another_replica_is_found_by_the_owner_inline_and_by_id(tmp_path):
    with fresh_database() as dsn:
        a, b = (ServerProcess(dsn, log_path=tmp_path / f"{name}.log") for name in "ab")
        a.start()
        b.start()
        try:
            with httpx.Client(base_url=a.url, timeout=10, headers=JSON) as to_a, \
                    httpx.Client(base_url=b.url, timeout=10, headers=JSON) as to_b:
                for run in ("small", "big"):
                    assert to_a.put(f"/v1/runs/{run}", json={"world_size": BIG}).status_code == 200
                    assert to_a.post(f"/v1/runs/{run}/metrics", content=columns(0, list(range(BIG)))).status_code == 202
                    wait_until(lambda: run in (to_a.get("/readyz").json().get("leases") or {}), what=f"a owns {run}")
                for step in range(1, 10):   # one record a push: inline in the notification
                    for rank in range(BIG):
                        body = columns(step, [rank], 3 if step == 6 else None)
                        assert to_b.post("/v1/runs/small/metrics", content=body).status_code == 202
                for step in range(1, 10):   # the whole step in one push: read by id
                    body = columns(step, list(range(BIG)), 70 if step == 6 else None)
                    assert to_b.post("/v1/runs/big/metrics", content=body).status_code == 202

                def origins(run: str) -> list | None:
                    found = to_b.get(f"/v1/runs/{run}/findings").json()
                    return [(f["step"], f["ranks"], f["evidence"]["origin_metric"])
                            for f in found if f["kind"] == "non_finite"] or None
                assert wait_until(lambda: origins("small"), what="the owner's finding of the small push") \
                    == [(6, [3], "loss")]
                assert wait_until(lambda: origins("big"), what="the owner's finding of the big push") \
                    == [(6, [70], "loss")]
                leases = to_b.get("/readyz").json().get("leases") or {}
                assert "small" not in leases and "big" not in leases
        finally:
            a.stop()
            b.stop()
