"""How often a NaN that pages crosses the store's writer: every writer job it causes, from the
push to the webhook's recorded delivery, counted on both stores (the drain barrier's empty jobs
left out). Each pass is a hand-off to the writer thread and a transaction; fewer is cheaper and
simpler to follow. The one-pipeline design makes it three (ingest; the findings with their
alerts and outbox rows; delivery's record and claim), pinned here, so a pass added unnoticed
fails.
"""
from __future__ import annotations

import json
import threading
import traceback

import pytest

from healthsvc.store.writer import GroupCommitWriter
from tests.alerting.receiver import Receiver
from tests.harness import InProcessService

pytestmark = pytest.mark.both_stores

JSON = {"content-type": "application/json"}


def passes_of_a_paging_nan(tmp_path, db_uri, monkeypatch) -> list[str]:
    """The writer jobs the NaN causes, by the thread that submits each, in order, from its push
    until the drain barrier says all it caused is done. Left out: the barrier's own empty jobs
    and state snapshots (time makes them, not the NaN)."""
    jobs: list[str] = []
    counting_on = threading.Event()
    real = GroupCommitWriter.submit

    def counting(self, job):
        if counting_on.is_set() and not getattr(job, "__qualname__", "").startswith("StoreBase.barrier"):
            stack = "".join(traceback.format_stack(limit=8))
            if "snapshot" not in stack:
                thread = threading.current_thread().name
                jobs.append("request" if thread.startswith(("asyncio", "MainThread", "AnyIO")) else thread.rstrip("_0123456789"))
        return real(self, job)

    with Receiver() as rx, InProcessService(tmp_path, db=db_uri, alert_webhooks=[
            {"id": "oncall", "url": rx.url, "format": "json"}]) as svc:
        def push(step: int, loss: list[float]) -> None:
            body = {"columns": {"step": [step, step], "rank": [0, 1], "loss": loss}}
            assert svc.http.post("/v1/runs/r/metrics", content=json.dumps(body), headers=JSON).status_code == 202
        for step in range(5):
            push(step, [1.0, 1.0])
        svc.drain()
        monkeypatch.setattr(GroupCommitWriter, "submit", counting)
        counting_on.set()
        push(5, [float("nan"), 1.0])
        svc.drain()
        counting_on.clear()
        assert len(rx.delivered()) == 1          # it paged
    return jobs


def test_a_paging_nan_crosses_the_writer_at_most_three_times(tmp_path, db_uri, monkeypatch):
    assert passes_of_a_paging_nan(tmp_path, db_uri, monkeypatch) == [
        "request",             # ingest
        "healthsvc-monitor",   # the findings, their alerts, notifications and outbox rows (the page
                               # claimed for the delivery worker), its rollback target looked up before
        "webhook-delivery",    # the delivery pass records the attempt (and would claim what is due next)
    ]
