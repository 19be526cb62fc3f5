"""uvicorn's HTTP protocol, with the plain metrics push answered where its request was parsed.

Through ASGI, even the fast path (``fast_path.py``) pays uvicorn's request cycle for every push:
a scope dict, an asyncio task and an event, the guard's and the fast path's coroutines, the
``receive`` and ``send`` calls, and the answer written in two pieces. A push is the one request
that comes hundreds of times a second, so :class:`IngestProtocol` (what ``healthsvc serve`` runs,
a subclass of uvicorn's httptools protocol) serves it in the protocol's own callbacks instead:
the guard's verdict (:meth:`~healthsvc.auth.guard.Guard.admission`, the same code), then the same
steps as every other way in (``accept.py``: parse, submit, answer), the answer written once when
the store's writer has committed, no task at all. bench/ab_concurrent.py against the tree before
it: 1.07x the requests per server CPU-second at 1 and at 64 records a push, 1.04x at 1,024 in rows
(docs/performance.md, stop 46).

Only the plain push takes this way: ``POST /v1/runs/{run_id}/metrics`` over HTTP/1.1 with a
``Content-Length`` within ``max_body_bytes``, no ``Expect: 100-continue``, admitted by the guard.
Anything else (another route, a chunked or oversized body, a rejection, HTTP/1.0, a server over
uvicorn's ``limit_concurrency``) goes through ASGI exactly as before, so each answer other than
the plain push's has one implementation. Pipelined requests keep their order: uvicorn queues a
request behind the one in progress, and starts it (here or through ASGI) once that one answered.
With the access log on, every request goes through ASGI (the log is written by uvicorn's cycle).
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from healthsvc.auth.guard import Guard
from healthsvc.errors import HealthsvcError
from healthsvc.ingest.accept import answer_of, parse_push, submit_push
from healthsvc.ingest.committed import WRITE_WAIT_S, not_committed
from healthsvc.ingest.fast_path import IngestFastPath, PUSH_PATH
from healthsvc.store.quotas import creator

log = logging.getLogger(__name__)

_INTERNAL = HealthsvcError("internal error while storing the push")   # a 500 (logged where it happened)


def protocol_for(asgi: Any, access_log: bool) -> type[asyncio.Protocol] | str:
    """The HTTP protocol class ``healthsvc serve`` gives uvicorn for ``asgi`` (``create_asgi``'s):
    :class:`IngestProtocol` bound to the service when the fast path is on and the access log off,
    else uvicorn's own (``httptools``)."""
    fast = asgi.app if isinstance(asgi, Guard) else None
    if access_log or not isinstance(fast, IngestFastPath):
        return "httptools"
    # uvicorn makes one protocol per connection from a class: the service is the class's.
    return type("ServiceIngestProtocol", (IngestProtocol,), {"guard": asgi, "ctx": fast.ctx})


class IngestProtocol(HttpToolsProtocol):
    guard: Guard     # the service's, set by protocol_for
    ctx: Any

    # -- uvicorn's hooks ------------------------------------------------------------------
    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """A request's turn (at once, or after the pipelined ones before it): served here when it
        is a plain push, else the ASGI task as uvicorn starts it."""
        push = self._plain_push(cycle) if app is self.app else None
        if push is None:
            return super()._start_asgi_task(cycle, app)
        cycle.push = push
        if not cycle.more_body:   # a pipelined push: its body came while it waited its turn
            self._run(cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if getattr(cycle, "push", None) is None or cycle.response_complete:
            return super().on_body(body)
        # No pause for a large body (uvicorn pauses reading until the app's receive() resumes it,
        # and nothing here calls receive): Content-Length, checked within max_body_bytes, bounds it.
        cycle.body += body

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if getattr(cycle, "push", None) is None or cycle.response_complete:
            return super().on_message_complete()
        cycle.more_body = False
        self._run(cycle)

    # -- the push ---------------------------------------------------------------------------
    def _plain_push(self, cycle: Any) -> tuple[str, str | None, Any] | None:
        """(run id, content encoding, token) of a plain push the guard admits; None for any other
        request."""
        scope = cycle.scope
        if scope["method"] != "POST" or scope["http_version"] != "1.1" or cycle.waiting_for_100_continue:
            return None
        m = PUSH_PATH.match(scope["path"])
        if m is None:
            return None
        length = encoding = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"content-encoding":
                encoding = value.decode("latin-1")
            elif name == b"transfer-encoding":
                return None
        if length is None or not length.isdigit() or int(length) > self.ctx.settings.max_body_bytes:
            return None
        verdict = self.guard.admission("POST", scope["path"], scope["headers"])
        if verdict.rejection is not None:
            return None
        return m.group(1), encoding, verdict.token

    def _run(self, cycle: Any) -> None:
        """Parse the push and hand it to the store's writer; answered once the write committed."""
        try:
            started = time.perf_counter()
            run_id, encoding, token = cycle.push
            try:
                batch, digest = parse_push(self.ctx, bytes(cycle.body), encoding)
            except HealthsvcError as exc:
                return self._error(cycle, exc)
            mark = creator.set(Guard.creator_of(token))   # read by the store with the write it queues
            try:
                write = submit_push(self.ctx, run_id, batch, digest)
            finally:
                creator.reset(mark)
        except Exception:
            log.exception("a metrics push failed before it reached the store")
            return self._error(cycle, _INTERNAL)
        loop = self.loop
        # No reference cycles (the future keeps its callbacks): this callback takes the future as
        # its argument, and the timer, which holds the future until it is cancelled, is the
        # request's. Every push's batch would otherwise wait for the garbage collector (it did:
        # the whole event loop ran 1.5x slower, the memory of thousands of pushes between two
        # collections).
        cycle.push_timer = loop.call_later(WRITE_WAIT_S, self._not_committed, cycle, write)

        def done(write: Future) -> None:   # on the writer thread
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._committed, cycle, write, batch, started)
        write.add_done_callback(done)

    def _committed(self, cycle: Any, write: Future, batch: Any, started: float) -> None:
        cycle.push_timer.cancel()
        if cycle.response_complete:   # answered 503 already: the store took too long
            return
        try:
            answer = answer_of(self.ctx, batch, write, started)
        except HealthsvcError as exc:
            return self._error(cycle, exc)
        except Exception:
            log.exception("a metrics push failed in the store")
            return self._error(cycle, _INTERNAL)
        self._answer(cycle, 202, orjson.dumps(answer))

    def _not_committed(self, cycle: Any, write: Future) -> None:
        if cycle.response_complete or write.done():
            return   # its own callback answers
        self.ctx.metrics.ingest_outcome["failed"].inc()
        self._error(cycle, not_committed(write, WRITE_WAIT_S))

    def _error(self, cycle: Any, exc: HealthsvcError) -> None:
        self._answer(cycle, exc.status_code, orjson.dumps({"detail": exc.detail()}))

    def _answer(self, cycle: Any, status: int, body: bytes) -> None:
        """The whole answer in one write (uvicorn's default headers, as its cycle writes them),
        then what uvicorn does when a response completes (the next pipelined request, keep-alive)."""
        if cycle.response_complete:
            return
        cycle.response_started = cycle.response_complete = True
        if not cycle.disconnected:
            head = [STATUS_LINE[status]]
            for name, value in cycle.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(), b"\r\n"]
            if not cycle.keep_alive:
                head.append(b"connection: close\r\n")
            head += [b"\r\n", body]
            self.transport.write(b"".join(head))
            if not cycle.keep_alive:
                self.transport.close()
        cycle.message_event.set()
        self.on_response_complete()
