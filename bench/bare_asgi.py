"""A bare ASGI app for the benchmarks' baseline (bench/ingest.py, bench/scale.py): what uvicorn
itself costs per request."""


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    # A POST is read whole and answered 202, as the ingest answers it (bench/scale.py pushes
    # the same bodies here as to the service); anything else is a health check.
    post = scope["method"] == "POST"
    while post:
        message = await receive()
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 202 if post else 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"accepted":1}' if post else b'{"status":"ok"}'})
