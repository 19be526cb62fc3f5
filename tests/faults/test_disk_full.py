"""The disk under the SQLite store fills up: pushes are refused with 507 (never a 500, never
stored in part), ``/readyz`` says 503, everything acknowledged before stays readable, and once
space returns pushes work again and the whole history, NaNs included, reads back exactly, also
after a restart. The disk is a real 3 MiB tmpfs (we run as root in CI; skipped elsewhere).
"""
from __future__ import annotations

import json
import math
import subprocess

import httpx
import pytest

from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e

RANKS = 64


def step_columns(step: int) -> dict:
    """One step of every rank; rank 3's loss is NaN at step 5 (NaN must survive the full disk)."""
    loss = [float("nan") if (step == 5 and r == 3) else step + r / 100 for r in range(RANKS)]
    return {"columns": {"step": [step] * RANKS, "rank": list(range(RANKS)), "loss": loss,
                        "grad_norm": [1.0 + step / 1000] * RANKS}}


def expected_loss(step: int, rank: int) -> float:
    return float("nan") if (step == 5 and rank == 3) else step + rank / 100


def push(c: httpx.Client, step: int) -> httpx.Response:
    return c.post("/v1/runs/full/metrics", content=json.dumps(step_columns(step)),
                  headers={"content-type": "application/json"})


def stored(c: httpx.Client) -> dict[tuple[int, int], float]:
    """The run's loss history as the API returns it (NaN as a NaN token or the string "NaN")."""
    cols = json.loads(c.get("/v1/runs/full/metrics", params={"fields": "loss"}).text)["columns"]
    return {(s, r): float(v) if isinstance(v, str) else v for s, r, v in zip(cols["step"], cols["rank"], cols["loss"])}


def same_as_acked(got: dict[tuple[int, int], float], acked: list[int]) -> bool:
    want = {(s, r): expected_loss(s, r) for s in acked for r in range(RANKS)}
    if got.keys() != want.keys():
        return False
    return all(v is not None and (math.isnan(v) == math.isnan(want[k])) and (math.isnan(v) or v == want[k])
               for k, v in got.items())


def test_a_full_disk_refuses_with_507_keeps_what_was_acknowledged_and_recovers(small_disk):
    server = ServerProcess(small_disk / "hs.db", log_path=small_disk.parent / "server.log")
    with server, httpx.Client(base_url=server.url, timeout=30) as c:
        acked: list[int] = []
        for step in range(10):
            assert push(c, step).status_code == 202
            acked.append(step)
        filler = small_disk / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC

        # What the store had preallocated takes a few more pushes; then each is a 507.
        refused = None
        for step in range(10, 400):
            r = push(c, step)
            assert r.status_code in (202, 507), r.text
            if r.status_code == 507:
                refused = step
                break
            acked.append(step)
        assert refused is not None, "the disk never filled"
        assert r.json()["detail"][0]["type"] == "insufficient_storage"
        assert push(c, refused).status_code == 507
        ck = c.post("/v1/runs/full/checkpoints", json={"step": 9, "uri": "s3://b/ck9"})
        assert ck.status_code == 507, ck.text
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "failing" in ready.json()["reason"]
        # Reads go on while the disk is full: nothing acknowledged is missing, nothing refused is there.
        assert same_as_acked(stored(c), acked)

        filler.unlink()
        assert push(c, refused).status_code == 202
        acked.append(refused)
        assert c.post("/v1/runs/full/checkpoints", json={"step": 9, "uri": "s3://b/ck9"}).status_code in (200, 201, 202)
        assert c.get("/readyz").status_code == 200
        assert same_as_acked(stored(c), acked)
        assert [f["step"] for f in c.get("/v1/runs/full/findings", params={"kind": "non_finite"}).json()] == [5]

    with server:   # started again on the same file: the history is durable, not only cached
        with httpx.Client(base_url=server.url, timeout=30) as c:
            assert same_as_acked(stored(c), acked)
