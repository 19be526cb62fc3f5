"""The bit-flip restart of ``test_supervise_trainer.py``, pushed record by record over HTTP to a
real server (uvicorn, SQLite file) on a clock the test moves, so every interleaving is the same
each time.

What the example trainer does there: four ranks (node0..node3) fingerprint every 5 steps; node2's
weights flip after step 23, so the row of step 24 disagrees; the supervisor stops the job while
its ranks are somewhere past that, and the last step they reached is in flight for some ranks
only (a stopped process sends nothing more). It restarts three ranks (node0, node1, node3) from the
checkpoint of step 19 in a new attempt. The stopped attempt's last fingerprint row (here step 34,
with the digests of node0 and node2 only) was still waiting in the aligner for its other ranks
when the restart's first push arrived. It used to be judged then, as two digests that differ with
no majority, naming node0's rank, and stored in attempt 2: the spurious ``replica_mismatch`` the
e2e case saw in about half of its runs (at step 49 there, ``group_ranks: 2``,
``strict_majority: false``, ``last_agreeing_step: 19``). Whether it happened depended on
whether the new attempt's first push came before the aligner's 5 s wait ran out.
"""
from __future__ import annotations

import pytest

from tests.harness import ServedService

HOSTS = ("node0", "node1", "node2", "node3")
EVERY = 5          # a fingerprint after the update of steps 4, 9, 14, ...


def records(steps, slots, attempt: int, flipped_slot: int | None = None, flipped_from: int = 10**9):
    """Records of the given host slots, one per rank and step, as the example trainer's client
    sends them: the rank is the slot's place among the running hosts, the incarnation is new in
    every process, the digest is the same on every replica unless its weights flipped."""
    out = []
    for step in steps:
        for rank, slot in enumerate(slots):
            rec = {"step": step, "rank": rank, "host": HOSTS[slot], "loss": 2.0 - 1e-3 * step,
                   "grad_norm": 1.0, "world_size": len(slots), "incarnation": f"a{attempt}-{HOSTS[slot]}"}
            if (step + 1) % EVERY == 0:
                bad = slot == flipped_slot and step >= flipped_from
                rec["param_digest"] = f"{'flipped' if bad else 'same'}-{attempt}-{step:06d}"
            out.append(rec)
    return out


def push(http, run_id: str, recs) -> int:
    r = http.post(f"/v1/runs/{run_id}/metrics", json={"records": recs})
    assert r.status_code == 202, r.text
    return r.json()["attempt"]


def mismatches(http, run_id: str) -> list[tuple]:
    return sorted((f["attempt"], f["step"], tuple(f["ranks"]), f["status"])
                  for f in http.get(f"/v1/runs/{run_id}/findings", params={"kind": "replica_mismatch"}).json())


@pytest.fixture
def svc(tmp_path):
    with ServedService(tmp_path) as service:
        yield service


def stopped_mid_step(http, run_id: str, sent=("node0", "node2")) -> None:
    """Attempt 1: four ranks to step 33, node2 flipped from step 24; of step 34 (a fingerprint
    step) only the records of the hosts ``sent`` were sent before the job was stopped."""
    assert http.put(f"/v1/runs/{run_id}", json={"world_size": 4}).status_code == 200
    assert push(http, run_id, records(range(0, 34), (0, 1, 2, 3), 1, flipped_slot=2, flipped_from=24)) == 1
    last = [r for r in records([34], (0, 1, 2, 3), 1, flipped_slot=2, flipped_from=24) if r["host"] in sent]
    assert push(http, run_id, last) == 1


def restarted_without_node2(http, run_id: str) -> None:
    """What the supervisor posts, then the restarted job's first push (three ranks, step 20)."""
    assert http.post(f"/v1/runs/{run_id}/events", json={"kind": "world_size_change", "step": 19, "data": {
        "old": 4, "new": 3, "reason": "hosts left out: node2"}}).status_code == 201
    assert push(http, run_id, records([20], (0, 1, 3), 2)) == 2


# node0 and node2: two digests that differ (it named node0, in attempt 2 when the restart's first
# push beat the aligner's wait, else in attempt 1); node0 and node1: two that agree (it resolved
# node2's mismatch, "digests agree again", and moved the proof's last agreeing step to 34).
@pytest.mark.parametrize("sent", [("node0", "node2"), ("node0", "node1")])
def test_the_stopped_attempts_last_partial_row_is_no_mismatch_in_the_restarted_attempt(svc, sent):
    http, run_id = svc.http, "restart-rows"
    stopped_mid_step(http, run_id, sent)
    svc.drain()
    # Attempt 1's flip is found at its first fingerprint after it, naming node2's rank, once.
    assert mismatches(http, run_id) == [(1, 24, (2,), "firing")]
    restarted_without_node2(http, run_id)
    assert push(http, run_id, records(range(21, 60), (0, 1, 3), 2)) == 2
    svc.advance(10)                    # every wait of the aligner is over
    assert http.post(f"/v1/runs/{run_id}/finish").status_code == 200
    svc.drain()
    # Nothing more: not the stopped attempt's half row of step 34 (node0 and node2 only), in
    # either attempt; attempt 2's three replicas agreed at every fingerprint.
    assert mismatches(http, run_id) == [(1, 24, (2,), "firing")]
    entries = http.get(f"/v1/runs/{run_id}/timeline").json()["entries"]
    [started] = [e for e in entries if e["kind"] == "attempt_started" and e["attempt"] == 2]
    assert started["world_size"] == 3


def test_a_real_mismatch_in_the_restarted_attempt_is_found_in_it(svc):
    http, run_id = svc.http, "restart-rows-real"
    stopped_mid_step(http, run_id)
    restarted_without_node2(http, run_id)
    # node3 (rank 2 now) flips after step 41: found at the fingerprint of step 44, in attempt 2,
    # with the proof of attempt 2's own last agreement (step 39).
    assert push(http, run_id, records(range(21, 60), (0, 1, 3), 2, flipped_slot=3, flipped_from=42)) == 2
    svc.advance(10)
    svc.drain()
    assert mismatches(http, run_id) == [(1, 24, (2,), "firing"), (2, 44, (2,), "firing")]
    [found] = [f for f in http.get(f"/v1/runs/{run_id}/findings", params={"kind": "replica_mismatch"}).json()
               if f["attempt"] == 2]
    assert found["evidence"]["last_agreeing_step"] == 39 and found["evidence"]["strict_majority"] is True
    assert found["hosts"] == ["node3"]


def test_a_partial_row_left_by_a_late_rank_while_the_run_goes_on_is_not_judged(svc):
    # Within one attempt: the row of step 24 waits for node3's record past the aligner's wait
    # (its push is late), so it is handed on with three digests of four, node2's the odd one;
    # that row is skipped, and the next complete one (step 29) names node2, with the proof
    # reaching back to step 19, where all four last agreed.
    http, run_id = svc.http, "late-rank-row"
    assert http.put(f"/v1/runs/{run_id}", json={"world_size": 4}).status_code == 200
    recs = records(range(0, 25), (0, 1, 2, 3), 1, flipped_slot=2, flipped_from=24)
    late = [r for r in recs if r["step"] == 24 and r["host"] == "node3"]
    push(http, run_id, [r for r in recs if r not in late])
    svc.advance(10)                    # node3's step 24 is given up on
    push(http, run_id, late)           # late: dropped from the aligned view, stored
    push(http, run_id, records(range(25, 40), (0, 1, 2, 3), 1, flipped_slot=2, flipped_from=24))
    svc.advance(10)
    found = http.get(f"/v1/runs/{run_id}/findings", params={"kind": "replica_mismatch"}).json()
    assert [(f["step"], f["ranks"], f["evidence"]["last_agreeing_step"]) for f in found] == [(29, [2], 19)]
