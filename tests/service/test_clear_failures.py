"""Clear failures (issue 12, finding 9): a full disk is a 507 with a JSON body and /readyz says
not ready until writes work again; an oversized body sent whole gets its 413; webhook delivery
resumes within seconds of a receiver's recovery."""
from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request

import httpx
import pytest

from tests.server_process import ServerProcess
from tests.alerting.receiver import Receiver
from tests.harness import InProcessService


def _post_whole(url: str, body: bytes) -> tuple[int, dict]:
    """urllib sends the whole body before it reads the answer (what found the reset)."""
    req = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_an_oversized_body_sent_whole_gets_its_413(tmp_path):
    env = {"HEALTHSVC_MAX_BODY_BYTES": str(1 << 20)}
    with ServerProcess(tmp_path / "b.db", env=env) as srv:
        big = b'{"records": [' + b'{"step": 0, "rank": 0, "loss": 1.0},' * 900_000 + b'{"step": 1, "rank": 0}]}'
        assert len(big) > 30 * 2**20
        for path in ("/v1/runs/big/metrics", "/v1/runs/big/checkpoints"):   # fast path, FastAPI route
            status, body = _post_whole(srv.url + path, big)
            assert status == 413 and body["detail"][0]["type"] == "payload_too_large", path
        assert httpx.get(srv.url + "/readyz").status_code == 200


@pytest.fixture
def small_disk(tmp_path):
    """A real full disk: a 3 MiB tmpfs (needs root to mount; skipped elsewhere)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_a_507_and_not_ready_until_space_returns(small_disk):
    with ServerProcess(small_disk / "d.db", log_path=small_disk.parent / "d.log") as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as c:
        filler = small_disk / "filler"
        # Fill the disk leaving little room; then push until the store says it is full.
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k", "count=1000"], capture_output=True)
        step, resp = 0, None
        for step in range(2000):
            cols = {"step": [step] * 256, "rank": list(range(256)), "loss": [float(i) for i in range(256)],
                    "grad_norm": [float(i) * 1.37 for i in range(256)]}
            resp = c.post("/v1/runs/full/metrics", json={"columns": cols, "batch_id": f"b{step}"})
            if resp.status_code != 202:
                break
        assert resp.status_code == 507, resp.text
        assert resp.json()["detail"][0]["type"] == "insufficient_storage"
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "failing" in ready.json()["reason"]
        filler.unlink()
        retry = c.post("/v1/runs/full/metrics", json={"columns": cols, "batch_id": f"b{step}"})
        assert retry.status_code == 202, retry.text
        assert c.get("/readyz").status_code == 200
        assert c.get("/v1/runs/full").json()["last_step"] == step


def test_delivery_resumes_within_seconds_of_the_receivers_recovery(tmp_path):
    # In process on a fake clock, default delivery settings (backoff capped at 10 s).
    from tests.alerting.receiver import free_port
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    with InProcessService(tmp_path, alert_webhooks=[{"id": "rx", "url": url, "format": "json"}]) as svc:
        c = svc.http
        for run in ("r1", "r2"):
            assert c.post(f"/v1/runs/{run}/metrics",
                          json={"records": [{"step": 0, "rank": 0, "loss": "NaN"}]}).status_code == 202
        # The receiver stays down until each delivery has failed 5 times (the backoff has grown: with
        # the old 300 s cap the next attempt could be minutes away).
        svc.drain()
        for _ in range(600):
            items = c.get("/v1/webhooks/rx/deliveries").json()
            items = items.get("deliveries", items) if isinstance(items, dict) else items
            if len(items) >= 2 and min(d["attempts"] for d in items) >= 5:
                break
            svc.advance(1.0)
        else:
            raise AssertionError(f"deliveries did not retry: {items}")
        with Receiver(port=port) as rx:
            recovered = svc.clock()
            while len(rx.delivered()) < 2 and svc.clock() - recovered < 20.0:
                svc.advance(1.0)
            assert len(rx.delivered()) == 2
            assert svc.clock() - recovered < 12.0
