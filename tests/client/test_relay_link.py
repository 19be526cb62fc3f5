"""A rank's side of the relay against a scripted relay (a real Unix socket whose answers the test
writes) and a scripted service (``MockTransport``): each way a hand-over can end badly ends with
the rank's records delivered, never counted as sent when they were not."""
from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time

import pytest

from healthsvc_client.delivery import Delivery
from healthsvc_client.relay_link import RelayLink
from healthsvc_client.retry import Backoff
from healthsvc_client.stats import Counters
from healthsvc_client.transport import MockTransport, Response

PATH = "/v1/runs/r/metrics"


def delivery(answer) -> tuple[Delivery, MockTransport]:
    transport = MockTransport(answer)
    d = Delivery(mode="online", transport=transport, spool=None, backoff=Backoff(0.001, 0.001),
                 max_attempts=2, timeout_s=1.0, gzip_min_bytes=-1, counters=Counters(),
                 problem=lambda key, message: None)
    return d, transport


def sent_ids(transport: MockTransport) -> list[str]:
    return [json.loads(r.body)["batch_id"] for r in transport.requests]


class ScriptedRelay:
    """A Unix socket that answers each hand-over with the lines ``script(message)`` returns
    (then, if ``hang_up``, closes the connection)."""

    def __init__(self, script, hang_up: bool = True) -> None:
        self.dir = tempfile.mkdtemp(prefix="hsl", dir="/tmp")
        self.path = os.path.join(self.dir, "relay.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(1)
        self.script, self.hang_up = script, hang_up
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            buffer = b""
            while b"\n" not in buffer:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    return
                buffer += chunk
            for line in self.script(json.loads(buffer.split(b"\n", 1)[0])):
                conn.sendall(line + b"\n")
            if not self.hang_up:
                conn.recv(1)   # hold the connection until the rank drops it

    def close(self) -> None:
        self.server.close()


def body(batch_id: str = "own") -> dict:
    return {"batch_id": batch_id, "records": [{"step": 0, "rank": 0, "loss": 1.0}]}


@pytest.fixture
def pending_dir():
    d = tempfile.mkdtemp(prefix="hsp", dir="/tmp")
    yield d


def test_a_reply_that_is_not_an_object_is_ignored_and_the_batch_posted_directly():
    relay = ScriptedRelay(lambda m: [b"[]", b"42"])
    d, transport = delivery(lambda req: Response(202))
    try:
        assert RelayLink(relay.path, d, timeout_s=5.0).deliver(PATH, body(), 1, urgent=False)
        assert sent_ids(transport) == ["own"] and d.counters.relay_fallbacks == 1
    finally:
        relay.close()


def test_a_prepared_body_the_service_refuses_makes_the_rank_post_its_own(pending_dir):
    file = os.path.join(pending_dir, "K.json")
    with open(file, "w") as fh:
        json.dump({"batch_id": "K", "columns": {"step": [0, 0], "rank": [0, 3], "bad name": [None, 1.0]}}, fh)
    relay = ScriptedRelay(lambda m: [json.dumps({"id": m["id"], "prepared": file}).encode()])   # then dies
    d, transport = delivery(lambda req: Response(422) if json.loads(req.body)["batch_id"] == "K" else Response(202))
    try:
        assert RelayLink(relay.path, d, timeout_s=5.0).deliver(PATH, body(), 1, urgent=False)
        assert sent_ids(transport) == ["K", "own"]       # the host's body refused: ours posted
        assert d.counters.sent_records == 1
    finally:
        relay.close()


def test_a_missing_body_with_a_tombstone_is_not_taken_for_stored(pending_dir):
    file = os.path.join(pending_dir, "K.json")
    open(os.path.join(pending_dir, "K.rejected"), "w").close()   # the relay was refused, then died
    relay = ScriptedRelay(lambda m: [json.dumps({"id": m["id"], "prepared": file}).encode()])
    d, transport = delivery(lambda req: Response(202))
    try:
        assert RelayLink(relay.path, d, timeout_s=5.0).deliver(PATH, body(), 1, urgent=False)
        assert sent_ids(transport) == ["own"]
    finally:
        relay.close()


def test_a_missing_body_without_a_tombstone_was_stored(pending_dir):
    file = os.path.join(pending_dir, "K.json")   # accepted: the relay removed it, then died
    relay = ScriptedRelay(lambda m: [json.dumps({"id": m["id"], "prepared": file}).encode()])
    d, transport = delivery(lambda req: Response(202))
    try:
        assert RelayLink(relay.path, d, timeout_s=5.0).deliver(PATH, body(), 1, urgent=False)
        assert transport.requests == [] and d.counters.sent_records == 1
    finally:
        relay.close()


def test_a_close_cuts_the_wait_for_a_stalled_relay_and_leaves_time_to_post_directly():
    # The relay takes the batch and never answers (stalled); the rank's close starts meanwhile.
    relay = ScriptedRelay(lambda m: [], hang_up=False)
    d, transport = delivery(lambda req: Response(202))
    link = RelayLink(relay.path, d, timeout_s=60.0)
    closing = threading.Timer(0.3, lambda: setattr(d, "deadline", time.monotonic() + 4.0))
    try:
        closing.start()
        assert link.deliver(PATH, body(), 1, urgent=True)   # posted directly, within the close budget
        assert sent_ids(transport) == ["own"]
        assert time.monotonic() <= d.deadline               # not the 60 s relay wait
    finally:
        closing.cancel()
        link.close()
        relay.close()
