"""Heartbeats and pushes against the real server's keep-alive (uvicorn closes a connection idle
for 5 s): a request never dies on a connection the server has just closed, and nothing is logged.

The idle gap is driven directly: the tests wait until the server has really closed the idle
connection (its socket reads EOF), then send."""
from __future__ import annotations

import logging
import select
import socket
import threading
import time

import httpx

from healthsvc_client.client import Run
from healthsvc_client.transport import HTTPTransport, Request
from tests.barriers import wait_until


def server_closed(sock: socket.socket) -> bool:
    """True once the peer closed the connection (the socket is readable and reads EOF)."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""


def test_a_request_on_a_connection_the_server_closed_is_sent_again_on_a_fresh_one(server):
    ping = Request("GET", "/healthz")
    lazy = HTTPTransport(server.url, idle_timeout_s=3600)     # never replaces an idle connection
    prompt = HTTPTransport(server.url)                          # replaces it after 4 s idle
    for t in (lazy, prompt):
        assert t.request(ping, 5.0).status == 200
    socks = [t._local.conn.sock for t in (lazy, prompt)]
    wait_until(lambda: all(server_closed(s) for s in socks), timeout_s=15.0, interval_s=0.05,
               what="the server to close the idle connections (it kept them)")

    assert lazy.request(ping, 5.0).status == 200       # written into a closed socket, then re-sent
    assert lazy.reconnects == 1
    assert prompt.request(ping, 5.0).status == 200     # never wrote into the closed socket
    assert prompt.reconnects == 0


def test_no_heartbeat_or_push_is_lost_at_1_5_s_and_6_s_steps(server, caplog):
    """Two trainings at once: 1.5 s steps (heartbeats every 5 s meet the keep-alive edge) and 6 s
    steps (every push finds its connection idle past the keep-alive)."""
    caplog.set_level(logging.DEBUG, logger="healthsvc.client")
    results: dict[str, Run] = {}

    def train(run_id: str, step_s: float, steps: int) -> None:
        run = Run(server.url, run_id, 0, heartbeat_interval_s=5.0)
        for step in range(steps):
            with run.phase("compute", step=step):
                time.sleep(step_s)              # the step: the idle time under test
            run.log(loss=1.0, step=step)
        assert run.finish(10.0)
        results[run_id] = run

    threads = [threading.Thread(target=train, args=("ka-fast", 1.5, 8)),
               threading.Thread(target=train, args=("ka-slow", 6.0, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(results) == {"ka-fast", "ka-slow"}

    with httpx.Client(base_url=server.url) as http:
        for run_id, steps in (("ka-fast", 8), ("ka-slow", 2)):
            st = results[run_id].stats()
            assert st.heartbeats_sent >= 2 and st.heartbeats_failed == 0, st
            assert st.retries == 0 and st.failed_requests == 0 and st.last_error is None, st
            assert st.sent_records == steps
            stored = http.get(f"/v1/runs/{run_id}/heartbeats").json()
            assert len(stored) >= 1
            assert http.get(f"/v1/runs/{run_id}/metrics").json()["columns"]["step"] == list(range(steps))
    assert [r.getMessage() for r in caplog.records if r.name == "healthsvc.client"] == []
