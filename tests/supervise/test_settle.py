"""The action decision settles before it acts on a corruption finding, against a real server
(uvicorn on 127.0.0.1 in this process, a fake clock; both stores).

The race, on cue: rank 1's NaN at step 30 is stored while rank 0's records from step 19 on and
its checkpoint of step 19 are still in its client's queues (what a loaded machine does: a
non-finite value is sent at once, rank 0 batches its records, and its checkpoints go behind
them). The supervisor asks then; only once the service is waiting (``healthsvc_supervise_settling``
on /metrics) does rank 0 send them. Step 19 is the right checkpoint: the onset interval of a NaN at
step 30 is 29..30, so a checkpoint of step 29 would not be clean (docs/rollback.md). Without the
settle rule the answer is the checkpoint of step 9, or ``no_clean_checkpoint`` when there is no
older one; with it, step 19. And the bound: a rank 0 that never reports past step 30 holds the
decision ``supervise_settle_s`` on the service clock, no longer, and the answer says which rank it
did not wait for.
"""
from __future__ import annotations

import json
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.barriers import wait_until
from tests.conftest import JSON
from tests.harness import ServedService
from tests.pg import database_for

pytestmark = pytest.mark.both_stores

NAN_STEP = 30
HELD = 19          # rank 0's checkpoint of this step, and its records from it on, come late
HOSTS = ("node-a", "node-b")


@pytest.fixture(scope="module")
def svc(tmp_path_factory, db_kind):
    directory = tmp_path_factory.mktemp("settle")
    with database_for(db_kind, directory) as db, ServedService(directory, db=db) as service:
        yield service


def push(http, run_id: str, rank: int, steps, nan_at: int | None = None) -> None:
    records = [{"step": s, "rank": rank, "host": HOSTS[rank], "incarnation": f"inc{rank}",
                "loss": "NaN" if s == nan_at else 2.0 - s * 1e-3, "grad_norm": 1.0,
                "local_grad_norm": "NaN" if s == nan_at else 1.0} for s in steps]
    r = http.post(f"/v1/runs/{run_id}/metrics", content=json.dumps({"records": records}))
    assert r.status_code == 202, r.text


def checkpoint(http, run_id: str, step: int) -> None:
    r = http.post(f"/v1/runs/{run_id}/checkpoints", json={"step": step, "uri": f"file:///ckpt/{step}"})
    assert r.status_code == 201, r.text


def metric(http, name: str) -> float:
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} is not on /metrics")


def the_nan_is_found_before_rank_0_catches_up(svc, run_id: str, early_checkpoints) -> None:
    """Rank 0 trained to step ``HELD - 1`` (``early_checkpoints`` stored), rank 1 to
    ``NAN_STEP - 1``; rank 1's NaN at ``NAN_STEP`` is stored and found; rank 0's records from
    ``HELD`` on and its checkpoint of ``HELD`` are not sent yet."""
    http = svc.http
    assert http.put(f"/v1/runs/{run_id}", json={"world_size": 2}).status_code == 200
    push(http, run_id, 0, range(HELD))
    for step in early_checkpoints:
        checkpoint(http, run_id, step)
    push(http, run_id, 1, range(NAN_STEP))
    push(http, run_id, 1, [NAN_STEP], nan_at=NAN_STEP)
    svc.drain()
    found = http.get(f"/v1/runs/{run_id}/findings", params={"kind": "non_finite"}).json()
    assert [(f["step"], f["ranks"], f["status"]) for f in found][:1] == [(NAN_STEP, [1], "firing")], found


class Asked:
    """``GET .../action`` on a thread of its own, as a supervisor asks while the job runs."""

    def __init__(self, http, run_id: str) -> None:
        self.answer: dict | None = None
        self._thread = threading.Thread(target=self._ask, args=(http, run_id), daemon=True)
        self._thread.start()

    def _ask(self, http, run_id: str) -> None:
        r = http.get(f"/v1/runs/{run_id}/action")
        assert r.status_code == 200, r.text
        self.answer = r.json()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> dict:
        self._thread.join(30)
        assert self.answer is not None, "the action request failed or did not return"
        return self.answer


def asked_and_waiting(svc, run_id: str) -> Asked:
    """Ask, and return once the service is settling the decision (or answered: without the
    settle rule it does at once, and the test then sees the answer it gave)."""
    asked = Asked(svc.http, run_id)
    wait_until(lambda: asked.done() or metric(svc.http, "healthsvc_supervise_settling") >= 1,
               what="the action request to be settling", interval_s=0.01)
    return asked


@pytest.mark.parametrize("early", [(9,), ()], ids=["older_checkpoint", "no_older_checkpoint"])
def test_a_checkpoint_sent_after_the_question_is_the_one_the_restart_resumes_from(svc, early):
    run_id = f"settle-race-{len(early)}"
    the_nan_is_found_before_rank_0_catches_up(svc, run_id, early)
    asked = asked_and_waiting(svc, run_id)
    # Rank 0's sender catches up: the record of step 19, its checkpoint, then the records after
    # it (and rank 1 goes on).
    push(svc.http, run_id, 0, [HELD])
    checkpoint(svc.http, run_id, HELD)
    push(svc.http, run_id, 0, range(HELD + 1, NAN_STEP + 2))
    push(svc.http, run_id, 1, [NAN_STEP + 1])
    a = asked.result()
    assert (a["action"], a["reason"]) == ("restart", "finding"), a
    assert a["checkpoint"]["step"] == HELD, a
    assert "supervise_settle_s" not in a["message"], a["message"]
    assert {(f["kind"], f["step"]) for f in a["findings"]} == {("non_finite", NAN_STEP)}


def test_a_rank_that_never_reports_past_the_cause_holds_the_decision_only_until_the_bound(svc):
    run_id = "settle-bound"
    the_nan_is_found_before_rank_0_catches_up(svc, run_id, (9,))
    push(svc.http, run_id, 1, [NAN_STEP + 1])           # rank 1 goes on, rank 0 is stuck at 18
    expired = metric(svc.http, "healthsvc_supervise_settle_expired_total")
    asked = asked_and_waiting(svc, run_id)
    assert not asked.done()
    # The bound is measured on the service clock, read before the settling gauge went up: one
    # step of the clock past it ends the wait (no tick runs, so nothing else is judged).
    svc.clock.advance(svc.settings.supervise_settle_s)
    a = asked.result()
    assert (a["action"], a["reason"], a["checkpoint"]["step"]) == ("restart", "finding", 9), a
    assert a["message"].endswith(
        f"Decided on what is stored after supervise_settle_s ({svc.settings.supervise_settle_s:g} s) ran "
        f"out with rank 0 not past step {NAN_STEP}: a checkpoint still on its way from them is not "
        "considered."), a["message"]
    assert metric(svc.http, "healthsvc_supervise_settle_expired_total") == expired + 1
    assert metric(svc.http, "healthsvc_supervise_settling") == 0


def test_a_checkpoint_stored_while_the_decision_is_computed_is_in_the_answer(svc, monkeypatch):
    # The same race a little later: rank 0 is behind, with no checkpoint stored, when the
    # rollback answer is read, and catches up (its records, its checkpoint of step 19, its
    # records past the NaN's step) while the decision is computed, before the settle looks at
    # the ranks. The settle then has nothing to wait for; the decision must still rest on what
    # is stored once the ranks are past the step, not on the answer read before: step 19, not
    # ``no_clean_checkpoint``. The catch-up runs at a barrier (the first policy decision, made
    # right after the answer was read), so the race is on cue, not on timing.
    from healthsvc.supervise import service as supervise_service
    run_id = "settle-race-during-decision"
    the_nan_is_found_before_rank_0_catches_up(svc, run_id, ())
    real = supervise_service.decide_action
    caught_up = threading.Event()

    def catch_up_then_decide(s, policy):
        if not caught_up.is_set():
            caught_up.set()
            assert s.rollback.step is None, s.rollback      # the answer read before: none clean
            with httpx.Client(base_url=svc.url, timeout=30, headers=JSON) as other:
                push(other, run_id, 0, [HELD])
                checkpoint(other, run_id, HELD)
                push(other, run_id, 0, range(HELD + 1, NAN_STEP + 2))
                push(other, run_id, 1, [NAN_STEP + 1])
            svc.drain()                                       # stored before the settle looks
        return real(s, policy)

    monkeypatch.setattr(supervise_service, "decide_action", catch_up_then_decide)
    a = svc.http.get(f"/v1/runs/{run_id}/action").json()
    assert caught_up.is_set()
    assert (a["action"], a["reason"]) == ("restart", "finding"), a
    assert a["checkpoint"]["step"] == HELD, a
    assert "supervise_settle_s" not in a["message"], a["message"]
