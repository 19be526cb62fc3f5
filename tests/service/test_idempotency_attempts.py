"""Re-sent batches are stored once; a restart opens a new attempt, both are kept, and the
effective history is the newest attempt. A restart is told by the records' ``incarnation`` (the
process that sent them) where the client sends one, else by steps that go back.

The tests share the module's server (``shared_http``, each under runs of its own); the two that
crash the server have one of their own (``server``, ``http``)."""
from __future__ import annotations

import csv
import io
import json
import pytest

pytestmark = pytest.mark.both_stores


def push(http, run, records, **extra):
    r = http.post(f"/v1/runs/{run}/metrics", content=json.dumps({"records": records, **extra}))
    assert r.status_code == 202, r.text
    return r.json()


def steps(start, stop, ranks=(0, 1), loss=1.0, process=None):
    """Records of ``ranks``; with ``process``, each rank's carries its process's incarnation, as
    the client sends (``p1`` and then, after a restart, ``p2``)."""
    inc = {} if process is None else {"incarnation": process}
    return [{"step": s, "rank": r, "loss": loss, **({"incarnation": f"{process}-rank{r}"} if inc else {})}
            for s in range(start, stop) for r in ranks]


def test_resent_batch_is_not_duplicated(shared_http):
    body = steps(0, 10)
    first = push(shared_http, "idem", body)
    again = push(shared_http, "idem", body)
    assert first == {"accepted": 20, "duplicate": False, "attempt": 1}
    assert again == {"accepted": 20, "duplicate": True, "attempt": 1}
    cols = shared_http.get("/v1/runs/idem/metrics").json()["columns"]
    assert len(cols["step"]) == 20
    # An explicit batch_id makes a retry idempotent even if the body bytes differ.
    push(shared_http, "idem", steps(10, 12), batch_id="b-1")
    assert push(shared_http, "idem", steps(10, 12, loss=9.9), batch_id="b-1")["duplicate"] is True
    cols = shared_http.get("/v1/runs/idem/metrics").json()["columns"]
    assert len(cols["step"]) == 24 and 9.9 not in cols["loss"]


def test_steps_going_back_open_a_new_attempt(http, server):
    push(http, "att", steps(0, 100, loss=1.0))           # attempt 1: steps 0..99
    ans = push(http, "att", steps(60, 80, loss=2.0))     # restart from a checkpoint at 59
    assert ans["attempt"] == 2
    push(http, "att", steps(80, 90, loss=2.0))           # continues attempt 2

    run = http.get("/v1/runs/att").json()
    assert [(a["attempt"], a["start_step"], a["last_step"]) for a in run["attempts"]] == [(1, 0, 99), (2, 60, 89)]
    assert run["attempt"] == 2 and run["last_step"] == 89

    eff = http.get("/v1/runs/att/metrics").json()["columns"]
    by_step = {}
    for s, r, a, loss in zip(eff["step"], eff["rank"], eff["attempt"], eff["loss"]):
        assert (s, r) not in by_step, "effective history holds one row per (step, rank)"
        by_step[(s, r)] = (a, loss)
    assert sorted({s for s, _ in by_step}) == list(range(0, 90))  # 90..99 of attempt 1 was abandoned
    assert all(by_step[(s, 0)] == (1, 1.0) for s in range(0, 60))
    assert all(by_step[(s, 0)] == (2, 2.0) for s in range(60, 90))

    # The abandoned branch is kept, not overwritten.
    old = http.get("/v1/runs/att/metrics", params={"attempt": 1}).json()["columns"]
    assert len(old["step"]) == 200 and set(old["loss"]) == {1.0}

    # Attempt bookkeeping survives a crash: after restart, going back again opens attempt 3.
    server.kill()
    server.start()
    assert push(http, "att", steps(90, 91))["attempt"] == 2
    assert push(http, "att", steps(85, 86))["attempt"] == 3


def test_run_summary_and_listing(shared_http):
    assert shared_http.put("/v1/runs/cfg", json={"world_size": 4, "batch_size_per_rank": 8, "tags": {"team": "llm"}}).status_code == 200
    push(shared_http, "cfg", [{"step": 0, "rank": r, "loss": 1.0, "host": f"node{r // 2}"} for r in range(3)])
    run = shared_http.get("/v1/runs/cfg").json()
    assert run["world_size"] == 4 and run["ranks_seen"] == 3 and run["config"]["tags"] == {"team": "llm"}
    assert run["status"] == "running" and run["last_push"] is not None
    assert shared_http.post("/v1/runs/cfg/finish").status_code == 200
    assert shared_http.get("/v1/runs/cfg").json()["status"] == "finished"
    assert "cfg" in [r["run_id"] for r in shared_http.get("/v1/runs").json()]
    csv_text = shared_http.get("/v1/runs/cfg/metrics", params={"format": "csv"}).text
    first = next(csv.DictReader(io.StringIO(csv_text)))
    assert (first["step"], first["rank"], first["attempt"], first["host"]) == ("0", "0", "1", "node0")


def test_checkpoints_events_heartbeats(shared_http):
    push(shared_http, "ck", steps(0, 5))
    assert shared_http.post("/v1/runs/ck/checkpoints", json={"step": 4, "uri": "file:///c/4", "duration_s": 2.5, "bytes": 10}).status_code == 201
    assert shared_http.post("/v1/runs/ck/checkpoints", json={"step": 4, "uri": "file:///c/4"}).status_code == 201  # idempotent
    ck = shared_http.get("/v1/runs/ck/checkpoints").json()
    assert len(ck) == 1 and ck[0]["duration_s"] == 2.5 and ck[0]["status"] == "ok" and ck[0]["attempt"] == 1
    assert shared_http.patch(f"/v1/runs/ck/checkpoints/{ck[0]['id']}", json={"status": "deleted"}).status_code == 200
    assert shared_http.get("/v1/runs/ck/checkpoints").json()[0]["status"] == "deleted"
    assert shared_http.patch("/v1/runs/ck/checkpoints/999", json={"status": "deleted"}).status_code == 404
    assert shared_http.post("/v1/runs/ck/events", json={"kind": "world_size_change", "step": 5, "data": {"old": 2, "new": 1}}).status_code == 201
    ev = shared_http.get("/v1/runs/ck/events").json()
    assert ev[0]["kind"] == "world_size_change" and ev[0]["data"] == {"old": 2, "new": 1}
    assert shared_http.post("/v1/runs/ck/heartbeats", json={"rank": 1, "step": 5, "phase": "collective"}).status_code == 202
    assert shared_http.get("/v1/runs/ck/heartbeats").json()[0]["phase"] == "collective"


def test_a_run_finishes_when_every_rank_has_finished(shared_http):
    push(shared_http, "fin", steps(0, 5))                                   # ranks 0 and 1
    assert shared_http.post("/v1/runs/fin/finish", json={"rank": 0, "step": 4}).status_code == 200
    assert shared_http.get("/v1/runs/fin").json()["status"] == "running"  # rank 1 is still finishing
    push(shared_http, "fin", steps(5, 6, ranks=(1,)))                       # its last records land later
    assert shared_http.get("/v1/runs/fin").json()["status"] == "running"
    shared_http.post("/v1/runs/fin/finish", json={"rank": 1, "step": 5})
    assert shared_http.get("/v1/runs/fin").json()["status"] == "finished"
    push(shared_http, "fin", steps(6, 7, ranks=(0,)))                       # data after finish: resumed
    assert shared_http.get("/v1/runs/fin").json()["status"] == "running"
    shared_http.post("/v1/runs/fin/finish")                                 # no rank: the whole run
    assert shared_http.get("/v1/runs/fin").json()["status"] == "finished"


def test_spooled_steps_uploaded_after_later_ones_fill_their_gap_and_are_not_a_restart(shared_http):
    # An outage sent steps 10-14 to the ranks' spools; 15-19 and the finish were delivered;
    # `healthsvc sync` uploads 10-14 afterwards. The same processes sent them: a gap filled late.
    push(shared_http, "late", steps(0, 10, process="p1"))
    push(shared_http, "late", steps(15, 20, process="p1"))
    for rank in (0, 1):
        assert shared_http.post("/v1/runs/late/finish", json={"rank": rank}).status_code == 200
    assert push(shared_http, "late", steps(10, 15, process="p1"), batch_id="spooled-1")["attempt"] == 1
    run = shared_http.get("/v1/runs/late").json()
    assert (run["attempt"], run["status"], run["last_step"]) == (1, "finished", 19)
    cols = shared_http.get("/v1/runs/late/metrics").json()["columns"]
    assert sorted(zip(cols["step"], cols["rank"])) == [(s, r) for s in range(20) for r in (0, 1)]


def test_a_restart_is_the_trainers_word_even_when_its_steps_go_on(shared_http):
    # The checkpoint was taken at the last reported step: the restarted processes report
    # steps after it (no step repeats). Their new incarnation says it is a restart; the other
    # rank's first push in it joins the attempt rather than opening a third.
    push(shared_http, "said", steps(0, 10, process="p1"))
    assert push(shared_http, "said", steps(10, 12, ranks=(0,), process="p2"))["attempt"] == 2
    assert push(shared_http, "said", steps(10, 12, ranks=(1,), process="p2"))["attempt"] == 2
    assert push(shared_http, "said", steps(12, 14, process="p2"))["attempt"] == 2
    run = shared_http.get("/v1/runs/said").json()
    assert [(a["attempt"], a["start_step"], a["last_step"]) for a in run["attempts"]] == [(1, 0, 9), (2, 10, 13)]


def test_records_of_a_process_from_before_the_restart_go_to_its_attempt(http, server):
    # Attempt 1 reached step 9 (steps 10-14 spooled by its processes); the job restarted from
    # a checkpoint at step 5. The old processes' spools are uploaded after the restart, even
    # after the service itself restarted: the records are attempt 1's, not a third attempt.
    push(http, "old", steps(0, 10, process="p1"))
    assert push(http, "old", steps(6, 12, process="p2"))["attempt"] == 2
    server.kill()
    server.start()
    assert push(http, "old", steps(10, 15, process="p1"), batch_id="old-spool")["attempt"] == 1
    assert push(http, "old", steps(12, 14, process="p2"))["attempt"] == 2
    run = http.get("/v1/runs/old").json()
    assert run["attempt"] == 2 and [a["attempt"] for a in run["attempts"]] == [1, 2]
    first = http.get("/v1/runs/old/metrics", params={"attempt": 1}).json()["columns"]
    assert sorted(set(first["step"])) == list(range(15))
    eff = http.get("/v1/runs/old/metrics").json()["columns"]
    assert sorted(zip(eff["step"], eff["attempt"], eff["rank"])) == sorted(
        (s, 1 if s < 6 else 2, r) for s in range(14) for r in (0, 1))