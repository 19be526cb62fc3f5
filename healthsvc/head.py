"""``HEAD`` answered as ``GET`` without the body (RFC 9110 9.3.2).

FastAPI's routes list only the methods they are declared with, so ``HEAD /v1/runs`` was a 405
although ``GET`` serves it: monitoring probes and ``curl -I`` use HEAD. The route runs as a GET
and every body chunk is sent empty; the headers (``Content-Length`` and ``Content-Type``
included) are the GET's, as the RFC asks.
"""
from __future__ import annotations


class HeadAsGet:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def without_body(message):
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_body)
