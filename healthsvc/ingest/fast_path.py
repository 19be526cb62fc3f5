"""ASGI fast path for ``POST /v1/runs/{run_id}/metrics``, the one high-rate endpoint.

Trainers push small batches often, and FastAPI's routing, dependency solving and middleware
cost more than parsing a small batch (bench/ingest.py: a GET /healthz through FastAPI costs about
4x what a bare uvicorn ASGI app costs). So this middleware answers the metrics push itself, in
front of the whole FastAPI app (see ``create_asgi``), with the same
code the documented FastAPI route runs (:func:`accept_metrics`). Everything else, and any request
it does not recognise (a bad run id, another method), goes on to FastAPI.
``HEALTHSVC_INGEST_FAST_PATH=0`` turns it off, and with it the protocol below.

``healthsvc serve`` answers the plain push earlier still, in uvicorn's protocol without an ASGI
task (``protocol.py``); this middleware serves the pushes that one passes on (a chunked body,
``Expect: 100-continue``, HTTP/1.0, the access log on) and the app driven in process.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import re

import orjson

from healthsvc.body_limit import DRAIN_LIMIT, _too_large_body, answer_after_draining
from healthsvc.deps import RUN_ID_PATTERN
from healthsvc.errors import HealthsvcError
from healthsvc.ingest.accept import accept_metrics

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


PUSH_PATH = re.compile(r"^/v1/runs/(" + RUN_ID_PATTERN.strip("^$") + r")/metrics$")
_JSON = [(b"content-type", b"application/json")]


class IngestFastPath:
    def __init__(self, app, ctx: ServiceContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        m = PUSH_PATH.match(scope["path"])
        if m is None:
            return await self.app(scope, receive, send)
        limit = self.ctx.settings.max_body_bytes
        encoding = None
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return await answer_after_draining(receive, send, 413, _too_large_body(limit), [], DRAIN_LIMIT)
            if name == b"content-encoding":
                encoding = value.decode("latin-1")
        parts, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            more = message.get("more_body", False)
            if size > limit:
                if not more:
                    return await _answer(send, 413, _too_large_body(limit))
                return await answer_after_draining(receive, send, 413, _too_large_body(limit), [], DRAIN_LIMIT)
            parts.append(chunk)
        raw = parts[0] if len(parts) == 1 else b"".join(parts)
        try:
            answer = await accept_metrics(self.ctx, m.group(1), raw, encoding)
        except HealthsvcError as exc:
            return await _answer(send, exc.status_code, orjson.dumps({"detail": exc.detail()}))
        await _answer(send, 202, orjson.dumps(answer))


async def _answer(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
