"""PostgreSQL SIGKILLed under load and started again.

The test's own cluster (``initdb`` in a temporary directory, a free port), one healthsvc server
on it and a real receiver. Three pushers push all along. A NaN of run ``before`` is found and
paged before the kill. While the postmaster is dead every push is answered 503 within the
client's timeout (never a 500, never a hang); once it is back pushes are 202 again, nothing
acknowledged is lost or stored twice, a NaN pushed after the recovery is found and paged, and
neither NaN is found or paged twice.
"""
from __future__ import annotations

import json

import httpx
import pytest

from tests.alerting.receiver import Receiver
from tests.barriers import wait_until
from tests.faults.load import JSON, Pusher, stored_once
from tests.faults.pg_cluster import PgCluster
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e

CLIENT_TIMEOUT_S = 10.0


def push_nan(url: str, run_id: str) -> None:
    body = {"columns": {"step": [0, 0, 1, 1], "rank": [0, 1, 0, 1], "loss": [2.0, 2.0, 2.0, float("nan")]}}
    r = httpx.post(f"{url}/v1/runs/{run_id}/metrics", content=json.dumps(body), headers=JSON, timeout=CLIENT_TIMEOUT_S)
    assert r.status_code == 202, r.text


def nan_findings(url: str, run_id: str) -> list[int]:
    found = httpx.get(f"{url}/v1/runs/{run_id}/findings", params={"kind": "non_finite"}, timeout=10).json()
    return [f["step"] for f in found if f["status"] == "firing"]


def pages(receiver: Receiver, run_id: str) -> list[str]:
    """The webhook ids of the delivered notifications that carried the run's firing NaN."""
    return [req.headers.get("webhook-id") for req in receiver.delivered()
            if any(a["kind"] == "non_finite" and a["status"] == "firing" and a["labels"]["run"] == run_id
                   for a in json.loads(req.body)["alerts"])]


def all_answer(pushers: list[Pusher], answer: str, at_least: int) -> bool:
    return all(p.answers[answer] >= at_least for p in pushers)


def test_postgres_killed_under_load_answers_503_then_loses_nothing_and_pages_once(tmp_path):
    with Receiver() as receiver, PgCluster() as pg:
        env = {"HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "oncall", "url": receiver.url, "format": "json"}])}
        server = ServerProcess(pg.uri, env=env, log_path=tmp_path / "server.log", extra_args=["--log-level", "info"])
        with server:
            push_nan(server.url, "before")
            wait_until(lambda: pages(receiver, "before"), 10, "the NaN before the kill paged")
            pushers = [Pusher(server.url, f"load-{i}", timeout_s=CLIENT_TIMEOUT_S) for i in range(3)]
            for p in pushers:
                p.start()
            try:
                wait_until(lambda: all_answer(pushers, "202", 20), 20, "every pusher acknowledged")
                pg.kill()
                wait_until(lambda: all_answer(pushers, "503", 10), 3 * CLIENT_TIMEOUT_S, "503s while PostgreSQL is down")
                assert httpx.get(server.url + "/readyz", timeout=3).status_code == 503   # a probe's timeout
                acked_while_down = {p.run_id: p.answers["202"] for p in pushers}
                pg.start()
                wait_until(lambda: all(p.answers["202"] >= acked_while_down[p.run_id] + 20 for p in pushers),
                           30, "every pusher acknowledged again after the restart")
            finally:
                for p in pushers:
                    p.stop()
            for p in pushers:
                assert set(p.answers) <= {"202", "503"}, f"{p.run_id}: {dict(p.answers)} (a 500, a hang or a drop)"
                assert stored_once(server.url, p.run_id, p.acked) is None, stored_once(server.url, p.run_id, p.acked)
            wait_until(lambda: httpx.get(server.url + "/readyz", timeout=5).status_code == 200, 10, "ready again")

            push_nan(server.url, "after")
            wait_until(lambda: nan_findings(server.url, "after") == [1], 10, "the NaN after the recovery found")
            wait_until(lambda: pages(receiver, "after"), 10, "the NaN after the recovery paged")
            wait_until(lambda: httpx.get(f"{server.url}/v1/webhooks/oncall/deliveries").json()["counts"]["pending"] == 0,
                       10, "the outbox settled")
            for run_id in ("before", "after"):
                assert nan_findings(server.url, run_id) == [1], run_id
                assert len(pages(receiver, run_id)) == 1, run_id
