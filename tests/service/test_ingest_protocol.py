"""The plain metrics push is answered inside uvicorn's protocol (``healthsvc.ingest.protocol``),
every other request through ASGI. On a real server, over real sockets: what HTTP/1.1 lets a
client do to a push (pipeline it, ask to close, speak HTTP/1.0, chunk it, send more than uvicorn's
64 KiB read-ahead, ask for 100-continue, go away before the answer) gets the answer the ASGI
path gives, in order, with every push stored once; and a push leaves nothing for the garbage
collector (a reference cycle per push made the whole event loop 1.5x slower)."""
from __future__ import annotations

import socket

import httpx
import orjson
import pytest

from tests.barriers import wait_until
from tests.server_process import ServerProcess


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("protocol")
    server = ServerProcess(str(directory / "protocol.db"), log_path=directory / "server.log")
    server.start()
    yield server
    server.stop()


def push_body(step: int, ranks: int = 4) -> bytes:
    return orjson.dumps({"columns": {"step": [step] * ranks, "rank": list(range(ranks)), "loss": [1.0] * ranks}})


def request(run: str, body: bytes, *, version: str = "1.1", extra: str = "") -> bytes:
    return (f"POST /v1/runs/{run}/metrics HTTP/{version}\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def read_answers(sock: socket.socket, n: int) -> list[tuple[int, dict, bytes]]:
    """``n`` answers from ``sock``: (status, headers, body), in the order they came."""
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed after {len(out)} of {n} answers"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers["content-length"])
        while len(buf) < length:
            chunk = sock.recv(65536)
            assert chunk, "the connection closed inside an answer"
            buf += chunk
        out.append((int(lines[0].split()[1]), headers, buf[:length]))
        buf = buf[length:]
    return out


def stored_records(server: ServerProcess, run: str) -> int:
    r = httpx.get(f"{server.url}/v1/runs/{run}/metrics", timeout=30)
    return r.json()["n"] if r.status_code == 200 else 0


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def test_pipelined_requests_are_answered_in_order_whichever_way_each_is_served(served):
    """Three pushes, a bad one between them, and a GET, written back to back on one connection
    before any answer is read: five answers in the order asked, each push stored once."""
    bad = orjson.dumps({"columns": {"step": [0], "rank": [0], "loss": ["x"]}})
    with connect(served) as sock:
        sock.sendall(request("pipelined", push_body(0)) + request("pipelined", bad) + request("pipelined", push_body(1))
                     + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + request("pipelined", push_body(0)))
        answers = read_answers(sock, 5)
    assert [status for status, _, _ in answers] == [202, 422, 202, 200, 202]
    assert orjson.loads(answers[1][2])["detail"][0]["loc"] == ["body", "columns", "loss", 0]
    assert [orjson.loads(body)["duplicate"] for status, _, body in answers if status == 202] == [False, False, True]
    assert stored_records(served, "pipelined") == 8


def test_a_client_that_asks_to_close_gets_its_answer_then_the_close(served):
    for version, extra in (("1.1", "Connection: close\r\n"), ("1.0", "")):
        with connect(served) as sock:
            sock.sendall(request(f"closing-{version}", push_body(0), version=version, extra=extra))
            [(status, headers, _)] = read_answers(sock, 1)
            assert status == 202 and headers.get("connection") == "close"
            assert sock.recv(1) == b""   # then closed by the server
    assert stored_records(served, "closing-1.1") == 4 and stored_records(served, "closing-1.0") == 4


def test_a_body_beyond_uvicorns_read_ahead_is_read_whole(served):
    """uvicorn stops reading a body past 64 KiB until the app asks for more (through ASGI's
    receive, which the protocol does not call); the protocol reads on, Content-Length being within
    max_body_bytes. Some four megabytes arrive in many reads."""
    ranks = 65536
    body = orjson.dumps({"columns": {"step": [0] * ranks, "rank": list(range(ranks)),
                                     **{f: [1.0 + i / ranks for i in range(ranks)] for f in ("loss", "grad_norm", "step_time")}}})
    assert len(body) > 3 * 1024 * 1024
    r = httpx.post(f"{served.url}/v1/runs/large/metrics", content=body,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 202 and r.json()["accepted"] == ranks


def test_a_chunked_push_and_one_that_waits_for_100_continue_are_stored(served):
    def chunks():
        body = push_body(0)
        yield body[:10]
        yield body[10:]
    r = httpx.post(f"{served.url}/v1/runs/chunked/metrics", content=chunks(),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 202 and r.json()["accepted"] == 4
    with connect(served) as sock:
        body = push_body(0)
        head, _, _ = request("continue", body, extra="Expect: 100-continue\r\n").partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 100")
        sock.sendall(body)
        [(status, _, answer)] = read_answers(sock, 1)
    assert status == 202 and orjson.loads(answer)["accepted"] == 4


def test_a_client_gone_before_its_answer_leaves_its_push_stored_once_and_the_server_serving(served):
    with connect(served) as sock:
        sock.sendall(request("gone", push_body(0)))
    # The push is stored although nobody heard the answer; a retry is a duplicate.
    wait_until(lambda: stored_records(served, "gone") == 4, timeout_s=30, what="the abandoned push stored")
    r = httpx.post(f"{served.url}/v1/runs/gone/metrics", content=push_body(0),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 202 and r.json()["duplicate"] is True


def test_a_push_leaves_nothing_for_the_garbage_collector(served):
    """Two thousand pushes, and not one young collection: whatever a push allocates is freed
    when it is answered (with a reference cycle per push, the collector ran about every
    1,400 pushes, and found some 36 objects a push, the batch's arrays among them)."""
    from prometheus_client.parser import text_string_to_metric_families

    def collections() -> tuple[float, float]:
        text = httpx.get(served.url + "/metrics", timeout=10).text
        found = {(s.name, s.labels.get("generation")): s.value
                 for fam in text_string_to_metric_families(text) for s in fam.samples}
        return found[("python_gc_collections_total", "0")], found[("python_gc_objects_collected_total", "0")]

    with httpx.Client(base_url=served.url, timeout=30, headers={"content-type": "application/json"}) as http:
        for step in range(20):   # warm: the run exists, every path taken once
            assert http.post("/v1/runs/garbage/metrics", content=push_body(step, 64)).status_code == 202
        before = collections()
        for step in range(20, 2020):
            assert http.post("/v1/runs/garbage/metrics", content=push_body(step, 64)).status_code == 202
        after = collections()
    assert after == before, (before, after)
