"""ASGI middleware that answers 413 for bodies over the configured limit, before a route reads them.

It checks ``Content-Length`` up front and counts the bytes of chunked bodies as they stream in, so
an oversized request never reaches a handler and is never half-applied.
"""
from __future__ import annotations

import orjson


class BodyTooLarge(Exception):
    pass


def _too_large_body(limit: int) -> bytes:
    return orjson.dumps({"detail": [{"loc": ["body"], "type": "payload_too_large",
                                     "msg": f"request body exceeds the limit of {limit} bytes",
                                     "hint": "split the batch into smaller requests"}]})


class BodyLimitMiddleware:
    def __init__(self, app, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    return await self._reject(send, receive)
                break
        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(send, receive)

    async def _reject(self, send, receive=None) -> None:
        body = _too_large_body(self.max_body_bytes)
        if receive is not None:
            return await answer_after_draining(receive, send, 413, body, [], DRAIN_LIMIT)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


# A rejected body up to this size is read and thrown away before the answer, so a client that
# sends it whole before reading (Python's urllib) sees the 413 instead of a connection reset.
DRAIN_LIMIT = 1 << 30


async def answer_after_draining(receive, send, status: int, body: bytes, headers: list, limit: int) -> None:
    """Read and discard the rest of the request body (up to ``limit`` bytes), then answer and
    ask the client to close the connection."""
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})
