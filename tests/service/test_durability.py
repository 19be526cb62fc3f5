"""An acknowledged record is durable: SIGKILL the server during a load of concurrent pushes,
restart it on the same file, and every record that got a 202 is there."""
from __future__ import annotations

import threading

import httpx

from tests.barriers import wait_until
import pytest

pytestmark = pytest.mark.both_stores


def pusher(url: str, rank: int, acked: list, stop: threading.Event) -> None:
    step = 0
    with httpx.Client(base_url=url, timeout=5) as client:
        while not stop.is_set():
            records = [{"step": step + i, "rank": rank, "loss": 1.0 / (1 + step + i), "step_time": 0.1}
                       for i in range(8)]
            try:
                r = client.post("/v1/runs/crash/metrics", json={"records": records})
            except httpx.HTTPError:
                return  # the server died under us: this batch was not acknowledged
            if r.status_code == 202:
                acked.extend((rec["step"], rank) for rec in records)
            step += 8


def test_sigkill_loses_no_acknowledged_record(server, http):
    acked: list[tuple[int, int]] = []
    stop = threading.Event()
    threads = [threading.Thread(target=pusher, args=(server.url, rank, acked, stop)) for rank in range(8)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 3000, timeout_s=30, interval_s=0.05, what="the load to get going (3000 acknowledged records)")
    finally:
        server.kill()  # mid-flight: requests are being parsed, committed and answered
        stop.set()
        for t in threads:
            t.join(10)

    server.start()
    cols = http.get("/v1/runs/crash/metrics", params={"fields": "loss"}).json()["columns"]
    stored = set(zip(cols["step"], cols["rank"]))
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    # Values are intact too, not just keys.
    for step, rank, loss in zip(cols["step"], cols["rank"], cols["loss"]):
        assert loss == 1.0 / (1 + step)
    # Nothing after the crash repeats or breaks: the same ranks go on pushing.
    r = http.post("/v1/runs/crash/metrics", json={"records": [{"step": 10**6, "rank": 0, "loss": 0.5}]})
    assert r.status_code == 202 and r.json()["attempt"] == 1
