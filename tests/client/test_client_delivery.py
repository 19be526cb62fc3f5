"""What the client puts on the wire when the service is healthy."""
from __future__ import annotations

import gzip
import json
import math

import pytest

from healthsvc_client.client import Run
from healthsvc_client.transport import MockTransport, Response
from tests.client.conftest import decode_body, wait_until


def test_records_carry_step_rank_host_world_size_and_values(make_run, service):
    run = make_run(rank=3, host="node-7", world_size=8)
    run.log({"loss": 2.5, "grad_norm": 0.75}, step=10)
    run.log(loss=2.25, step=11)
    assert run.flush(2.0)
    records = service.records()
    assert [(r["step"], r["rank"], r["host"], r["world_size"]) for r in records] == [
        (10, 3, "node-7", 8), (11, 3, "node-7", 8)]
    assert records[0]["loss"] == 2.5 and records[0]["grad_norm"] == 0.75
    assert records[1]["loss"] == 2.25 and "grad_norm" not in records[1]
    assert all(isinstance(r["ts"], float) for r in records)


def test_nan_and_inf_leave_as_json_tokens_not_null(make_run, service):
    run = make_run()
    run.log(loss=float("nan"), grad_norm=float("inf"), lr=float("-inf"), step=0)
    assert run.flush(2.0)
    raw = service.requests("metrics")[0]
    text = (gzip.decompress(raw.body) if raw.headers.get("Content-Encoding") else raw.body).decode()
    assert '"loss":NaN' in text and '"grad_norm":Infinity' in text and '"lr":-Infinity' in text
    assert "null" not in text
    record = service.records()[0]
    assert math.isnan(record["loss"]) and record["grad_norm"] == math.inf


def test_non_finite_value_is_flushed_without_waiting_for_the_interval(make_run, service):
    run = make_run(flush_interval_s=30.0)
    wakes = []   # the sender sends when woken or when its interval is over (30 s: not in this test)
    wake = run._wake.set
    run._wake.set = lambda: (wakes.append(True), wake())[1]
    run.log(loss=1.0, step=0)
    run.log(loss=1.5, step=1)
    assert wakes == [] and service.requests("metrics") == []   # batched, waiting: nobody woke the sender
    run.log(loss=float("nan"), step=2)
    assert wakes == [True]
    assert wait_until(lambda: service.requests("metrics"), timeout_s=2.0)
    assert [r["step"] for r in service.records()] == [0, 1, 2]


def test_step_defaults_to_previous_plus_one_and_same_step_calls_merge(make_run, service):
    run = make_run()
    run.log(loss=1.0)                      # step 0
    run.log(loss=2.0)                      # step 1
    run.log({"step": 7, "loss": 3.0})      # a "step" key is the step
    run.log(grad_norm=0.5, step=7)         # merged into step 7's record
    run.log(loss=4.0)                      # step 8
    assert run.flush(2.0)
    records = service.records()
    assert [r["step"] for r in records] == [0, 1, 7, 8]
    assert records[2]["loss"] == 3.0 and records[2]["grad_norm"] == 0.5


def test_a_step_logged_in_two_calls_never_straddles_two_batches(make_run, service):
    # The service reads a (step, rank) it has already seen as a restart, so the client holds the
    # newest step back for one interval while more fields for it may follow.
    run = make_run(flush_interval_s=5.0)
    run.log(loss=1.0, step=5)
    run._wake.set()            # a sender cycle now, before the interval is over
    assert wait_until(lambda: run._held is not None)   # barrier: that cycle held the step back
    assert service.requests("metrics") == []
    run.log(grad_norm=2.0, step=5)
    assert run.flush(2.0)
    assert service.records() == [dict(service.records()[0], step=5, loss=1.0, grad_norm=2.0)]


def test_finish_never_overtakes_a_held_back_record(make_run, service):
    run = make_run(flush_interval_s=5.0)
    run.log(loss=1.0, step=9)
    run._wake.set()
    assert wait_until(lambda: run._held is not None)   # the sender holds step 9 back
    run.checkpoint(9, "file:///c9")
    assert run.finish(2.0)
    order = [r.path.rsplit("/", 1)[-1] for _, r in service.arrivals]
    assert order == ["metrics", "checkpoints", "finish"]


def test_a_finish_queued_while_the_sender_is_sending_does_not_overtake_the_held_record(make_run, service):
    # The pass sends step 0 and holds step 1 back (it may still grow); while step 0 is on the
    # wire, the training thread queues a checkpoint (as finish() queues its finish). The same
    # pass sends that control: the held step goes first (e2e: rank 0's last step arrived after
    # its finish and reopened the finished run).
    run = make_run(flush_interval_s=60.0, max_batch=2)
    queued = []

    def queue_a_control_during_the_first_send(request):
        if not queued:
            queued.append(True)
            run.checkpoint(1, "file:///c1")
    service.hook = queue_a_control_during_the_first_send
    run.log(loss=1.0, step=0)
    run.log(loss=1.0, step=1)            # the queue reaches max_batch: a pass, not forced
    assert wait_until(lambda: service.requests("checkpoints"), timeout_s=5.0)
    order = [(r.path.rsplit("/", 1)[-1], [x["step"] for x in decode_body(r).get("records", [])])
             for _, r in service.arrivals]
    assert order == [("metrics", [0]), ("metrics", [1]), ("checkpoints", [])]


def test_records_logged_after_a_checkpoint_go_out_after_it(make_run, service):
    # The service reads a rank's record past a step as "what it registered before that step is
    # in" (the supervisor's settle rule): one pass that sent steps 0..12 and then the checkpoint
    # of step 9 would let it decide, on step 12, without that checkpoint.
    run = make_run(flush_interval_s=60.0)
    for step in range(10):
        run.log(loss=1.0, step=step)
    run.checkpoint(9, "file:///c9")
    run.event("note", step=10, message="after the checkpoint")
    for step in range(10, 13):
        run.log(loss=1.0, step=step)
    assert run.flush(2.0)
    order = [(r.path.rsplit("/", 1)[-1], [x["step"] for x in decode_body(r).get("records", [])])
             for _, r in service.arrivals]
    assert order == [("metrics", list(range(10))), ("checkpoints", []), ("events", []),
                     ("metrics", [10, 11, 12])]


def test_a_held_back_step_is_sent_after_the_interval_without_a_flush(make_run, service):
    run = make_run(flush_interval_s=0.05)
    run.log(loss=1.0, step=7)  # the last record before the rank hangs
    assert wait_until(lambda: service.records(), timeout_s=2.0)
    assert service.records()[0]["step"] == 7


def test_numpy_like_and_tensor_like_values_are_converted_on_the_sender(make_run, service):
    class Scalar:  # what numpy scalars and 0-d tensors look like to the client
        def __init__(self, v):
            self.v = v

        def item(self):
            return self.v

        def detach(self):
            return self

    run = make_run()
    run.log(loss=Scalar(1.25), tokens=Scalar(512), name_is_text="x", bad=object(), step=0)
    assert run.flush(2.0)
    record = service.records()[0]
    assert record["loss"] == 1.25 and record["tokens"] == 512 and record["name_is_text"] == "x"
    assert "bad" not in record
    assert run.stats().invalid_fields == 1


def test_each_metrics_body_has_a_unique_batch_id(make_run, service):
    run = make_run(max_batch=2)
    for step in range(6):
        run.log(loss=float(step), step=step)
    assert run.flush(2.0)
    bodies = service.bodies("metrics")
    assert sum(len(b["records"]) for b in bodies) == 6
    assert all(len(b["records"]) <= 2 for b in bodies)
    ids = [b["batch_id"] for b in bodies]
    assert len(set(ids)) == len(ids) and all(isinstance(i, str) and i for i in ids)


def test_large_bodies_are_gzipped_small_ones_are_not(make_run, service):
    run = make_run(gzip_min_bytes=500)
    run.log(loss=1.0, step=0)
    assert run.flush(2.0)
    for step in range(1, 100):
        run.log(loss=1.0, grad_norm=2.0, step=step)
    assert run.flush(2.0)
    small, large = service.requests("metrics")
    assert "Content-Encoding" not in small.headers
    assert large.headers["Content-Encoding"] == "gzip"
    assert len(json.loads(gzip.decompress(large.body))["records"]) == 99


def test_columns_mode_sends_one_columnar_body_for_all_ranks(make_run, service):
    run = make_run(world_size=4)
    run.log_columns({"rank": [0, 1, 2, 3], "loss": [1.0, 1.1, float("nan"), 1.3]}, step=5)
    run.log_columns({"rank": [0, 1, 2, 3], "grad_norm": [0.5] * 4}, step=6)
    assert run.flush(2.0)
    (body,) = service.bodies("metrics")
    cols = body["columns"]
    assert cols["step"] == [5, 5, 5, 5, 6, 6, 6, 6]
    assert cols["rank"] == [0, 1, 2, 3] * 2
    assert cols["loss"][:2] == [1.0, 1.1] and math.isnan(cols["loss"][2])
    assert cols["loss"][4:] == [None] * 4          # not reported at step 6: null, not NaN
    assert cols["grad_norm"] == [None] * 4 + [0.5] * 4
    assert "batch_id" in body and "records" not in body


def test_columns_without_rank_are_ignored_and_counted(make_run, service):
    run = make_run()
    run.log_columns({"loss": [1.0]}, step=0)
    assert run.stats().columns_logged == 0 and "rank" in run.stats().last_error


def test_checkpoint_event_alert_and_finish_bodies(make_run, service):
    run = make_run(rank=2)
    run.log(loss=1.0, step=1200)
    run.checkpoint(1200, "file:///ckpt/1200.pt", duration_s=4.5, bytes=1024)
    run.event("world_size_change", step=1201, old=4, new=3)
    run.alert("loss looks odd", severity="critical", step=1201)
    assert run.finish(2.0)
    assert service.bodies("checkpoints") == [
        {"step": 1200, "uri": "file:///ckpt/1200.pt", "duration_s": 4.5, "bytes": 1024}]
    change, note = service.bodies("events")
    assert set(change) == set(note) == {"kind", "step", "data"}  # the service forbids other keys
    assert change["data"].pop("ts") > 0 and note["data"].pop("ts") > 0
    assert (change["kind"], change["step"], change["data"]) == (
        "world_size_change", 1201, {"old": 4, "new": 3, "rank": 2})
    assert note["kind"] == "note" and note["data"] == {"message": "loss looks odd", "severity": "critical",
                                                       "rank": 2}
    assert service.bodies("finish") == [{"rank": 2, "step": 1200}]
    # Metrics logged before the checkpoint are sent before it.
    order = [r.path.rsplit("/", 1)[-1] for _, r in service.arrivals]
    assert order.index("metrics") < order.index("checkpoints") < order.index("finish")


def test_config_is_put_on_the_run(make_run, service):
    make_run(config={"world_size": 4, "hang_timeout_s": 60}).flush(2.0)
    (request,) = [r for _, r in service.arrivals if r.method == "PUT"]
    assert request.path == "/v1/runs/run-1" and decode_body(request)["hang_timeout_s"] == 60


def test_run_id_is_quoted_in_the_path(make_run, service):
    run = make_run(run_id="team a/exp 1")
    run.log(loss=1.0, step=0)
    assert run.flush(2.0)
    assert service.requests("metrics")[0].path == "/v1/runs/team%20a%2Fexp%201/metrics"


def test_calls_after_finish_are_ignored_and_counted(make_run, service):
    run = make_run()
    assert run.finish(2.0)
    run.log(loss=1.0, step=0)
    run.checkpoint(0, "x")
    assert run.stats().ignored_calls == 2 and service.requests("metrics") == []
    assert run.finish() is False  # idempotent


def test_context_manager_finishes_on_success_and_alerts_on_crash(service):
    with Run("http://fake", "ok", 0, transport=MockTransport(service), heartbeat_interval_s=0) as run:
        run.log(loss=1.0, step=0)
    assert service.bodies("finish") == [{"rank": 0, "step": 0}]

    with pytest.raises(RuntimeError):
        with Run("http://fake", "crash", 0, transport=MockTransport(service), heartbeat_interval_s=0):
            raise RuntimeError("boom")
    crash_events = [b for b in service.bodies("events") if b["data"]["severity"] == "critical"]
    assert len(crash_events) == 1 and "boom" in crash_events[0]["data"]["message"]
    assert len(service.bodies("finish")) == 1  # a crash is not a finish


@pytest.mark.parametrize("answer, expected", [
    (Response(200, {}, b'{"checkpoint": {"step": 800, "uri": "u"}, "onset": null, "reason": "r"}'),
     {"checkpoint": {"step": 800, "uri": "u"}, "onset": None, "reason": "r"}),
    (Response(503, {}, b""), None),
    (Response(200, {}, b"not json"), None),
])
def test_rollback_target(make_run, service, answer, expected):
    service.script["rollback"] = [answer]
    run = make_run()
    assert run.rollback_target() == expected
    (request,) = service.requests("rollback")
    assert request.method == "GET" and request.path == "/v1/runs/run-1/rollback"


def test_rollback_target_is_none_when_offline(tmp_path):
    run = Run(None, "r", 0, mode="offline", spool_path=tmp_path / "s.jsonl")
    assert run.rollback_target() is None
    run.finish(1.0)


@pytest.mark.parametrize("kwargs, message", [
    ({"rank": -1}, "rank"),
    ({"run_id": ""}, "run_id"),
    ({"mode": "sometimes"}, "mode"),
    ({"mode": "offline"}, "spool_path"),
    ({"url": None, "transport": None}, "url"),
])
def test_invalid_init_arguments_say_how_to_fix_them(kwargs, message):
    args = {"url": "http://x", "run_id": "r", "rank": 0, "transport": MockTransport(lambda r: Response(202))}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        Run(args.pop("url"), args.pop("run_id"), args.pop("rank"), **args)


def test_disabled_mode_sends_nothing():
    transport = MockTransport(lambda r: Response(202))
    run = Run("http://x", "r", 0, mode="disabled", transport=transport)
    run.log(loss=1.0, step=0)
    assert run.finish() is False and transport.requests == [] and run.stats().ignored_calls == 1
