"""Accepting one metrics push: decode, parse, store durably, count. Shared by the FastAPI route
(which documents it), the ASGI fast path and the ingest protocol (which serve it): the protocol
cannot await, so the push is three steps any of them runs in order, :func:`parse_push`,
:func:`submit_push` and, once the write is committed, :func:`answer_of`."""
from __future__ import annotations

import time
from concurrent.futures import Future

from healthsvc.errors import HealthsvcError, StoreUnavailable, quota_error, store_error
from healthsvc.store.batch import MetricBatch
from healthsvc.store.errors import STORE_ERRORS
from healthsvc.store.quotas import QuotaExceeded
from healthsvc.ingest.parse import decode_body, parse_metrics
from healthsvc.ingest.committed import committed

# What a write that was not stored fails with (answer_of says what each means to the client).
WRITE_FAILURES: tuple[type[BaseException], ...] = (*STORE_ERRORS, QuotaExceeded)


def parse_push(ctx, raw: bytes, content_encoding: str | None) -> tuple[MetricBatch, str]:
    """The batch and its idempotency key; HealthsvcError (4xx, counted as rejected) on bad input."""
    try:
        body = decode_body(raw, content_encoding, ctx.settings.max_body_bytes)
        return parse_metrics(body, ctx.settings.max_ranks, ctx.settings.max_metric_names)
    except HealthsvcError:
        ctx.metrics.ingest_outcome["rejected"].inc()
        raise


def submit_push(ctx, run_id: str, batch: MetricBatch, digest: str) -> Future:
    """The store's write of the batch (its result once committed)."""
    return ctx.store.ingest.submit_metrics(run_id, batch, digest)


def answer_of(ctx, batch: MetricBatch, write: Future, started: float) -> dict:
    """The 202 answer of a committed ``write``, counted; HealthsvcError (a 503/507/429 the
    client retries: nothing was stored) when it failed."""
    metrics = ctx.metrics
    try:
        result = write.result()
    except STORE_ERRORS as exc:  # nothing was stored: a 503/507 the client retries
        metrics.ingest_outcome["failed"].inc()
        raise store_error(exc) from None
    except QuotaExceeded as exc:  # nothing was stored either
        metrics.ingest_outcome["rejected"].inc()
        raise quota_error(exc) from None
    if result.duplicate:
        metrics.ingest_duplicates.inc()
        metrics.ingest_outcome["duplicate"].inc()
    else:
        metrics.ingest_outcome["accepted"].inc()
        metrics.ingest_records.inc(result.accepted)
        metrics.ingest_points.inc(batch.n_points)
    metrics.ingest_latency.observe(time.perf_counter() - started)
    return {"accepted": result.accepted, "duplicate": result.duplicate, "attempt": result.attempt}


async def accept_metrics(ctx, run_id: str, raw: bytes, content_encoding: str | None) -> dict:
    """Returns the 202 answer once the batch is durable; raises HealthsvcError (4xx) on bad input."""
    started = time.perf_counter()
    batch, digest = parse_push(ctx, raw, content_encoding)
    write = submit_push(ctx, run_id, batch, digest)
    try:
        await committed(write)
    except StoreUnavailable:     # the store does not answer: a 503 too
        ctx.metrics.ingest_outcome["failed"].inc()
        raise
    except WRITE_FAILURES:
        pass   # the write failed, nothing stored: answer_of says what that means to the client
    return answer_of(ctx, batch, write, started)
