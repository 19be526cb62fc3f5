"""Accepting one metrics push: decode, parse, store durably, count. Shared by the FastAPI route
(which documents it) and the ASGI fast path (which serves it)."""
from __future__ import annotations

import time

from healthsvc.errors import HealthsvcError, StoreUnavailable, quota_error, store_error
from healthsvc.store.errors import STORE_ERRORS
from healthsvc.store.quotas import QuotaExceeded
from healthsvc.ingest.parse import decode_body, parse_metrics
from healthsvc.ingest.committed import committed


async def accept_metrics(ctx, run_id: str, raw: bytes, content_encoding: str | None) -> dict:
    """Returns the 202 answer once the batch is durable; raises HealthsvcError (4xx) on bad input."""
    metrics = ctx.metrics
    started = time.perf_counter()
    try:
        body = decode_body(raw, content_encoding, ctx.settings.max_body_bytes)
        batch, digest = parse_metrics(body, ctx.settings.max_ranks, ctx.settings.max_metric_names)
    except HealthsvcError:
        metrics.ingest_outcome["rejected"].inc()
        raise
    try:
        result = await committed(ctx.store.ingest.submit_metrics(run_id, batch, digest))
    except STORE_ERRORS as exc:  # nothing was stored: a 503/507 the client retries
        metrics.ingest_outcome["failed"].inc()
        raise store_error(exc) from None
    except QuotaExceeded as exc:  # nothing was stored either
        metrics.ingest_outcome["rejected"].inc()
        raise quota_error(exc) from None
    except StoreUnavailable:     # the store does not answer: a 503 too
        metrics.ingest_outcome["failed"].inc()
        raise
    if result.duplicate:
        metrics.ingest_duplicates.inc()
        metrics.ingest_outcome["duplicate"].inc()
    else:
        metrics.ingest_outcome["accepted"].inc()
        metrics.ingest_records.inc(result.accepted)
        metrics.ingest_points.inc(batch.n_points)
    metrics.ingest_latency.observe(time.perf_counter() - started)
    return {"accepted": result.accepted, "duplicate": result.duplicate, "attempt": result.attempt}
