"""Upload an offline spool (``healthsvc_client.spool``) to a service: what ``healthsvc sync`` runs.

Lines are sent in file order, each with the client's retry policy. Metrics bodies carry the
``batch_id`` they were spooled with, so running the upload again after a partial failure does not
duplicate data on a server that deduplicates. Never raises for an unreachable service or a bad
line: the counts say what happened.

Example::

    >>> from healthsvc_client.transport import MockTransport, Response
    >>> import tempfile, os
    >>> from healthsvc_client.spool import SpoolWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "s.jsonl")
    >>> SpoolWriter(path).write("POST", "/v1/runs/r/metrics", {"records": [{"step": 0, "rank": 0}]})
    >>> upload_spool(path, "http://unused", transport=MockTransport(lambda r: Response(202)))
    {'lines': 1, 'sent': 1, 'failed': 0, 'rejected': 0, 'bad_lines': [], 'errors': []}
"""
from __future__ import annotations

import os
import random
import time
from typing import Any

from healthsvc_client.encode import encode_json, maybe_gzip
from healthsvc_client.retry import Backoff, is_retryable_status
from healthsvc_client.spool import read_spool
from healthsvc_client.transport import HTTPTransport, Request, Transport, TransportError


def upload_spool(path: str | os.PathLike[str], url: str, *, transport: Transport | None = None,
                 timeout_s: float = 10.0, max_attempts: int = 5, backoff_base_s: float = 0.5,
                 gzip_min_bytes: int = 1024, sleep=time.sleep) -> dict[str, Any]:
    """Send every spooled request to ``url``; returns counts.

    Result keys: ``lines`` (requests read), ``sent`` (2xx), ``failed`` (gave up after retries),
    ``rejected`` (non-retryable 4xx), ``bad_lines`` (unparseable line numbers, typically a line cut
    by a crash), ``errors`` (the first few messages).
    """
    transport = transport if transport is not None else HTTPTransport(url)
    backoff = Backoff(backoff_base_s, 30.0, random.Random())
    result: dict[str, Any] = {"lines": 0, "sent": 0, "failed": 0, "rejected": 0,
                              "bad_lines": [], "errors": []}

    def note(message: str) -> None:
        if len(result["errors"]) < 10:
            result["errors"].append(message)

    for method, req_path, body in read_spool(path, result["bad_lines"]):
        result["lines"] += 1
        payload, headers = maybe_gzip(encode_json(body), gzip_min_bytes)
        request = Request(method, req_path, payload, {"Content-Type": "application/json", **headers})
        retry_after = None
        outcome = "failed"
        for attempt in range(max_attempts):
            if attempt:
                sleep(backoff.delay_s(attempt - 1, retry_after))
            retry_after = None
            try:
                response = transport.request(request, timeout_s)
            except TransportError as exc:
                note(f"{method} {req_path}: {exc}")
                continue
            if 200 <= response.status < 300:
                outcome = "sent"
                break
            if is_retryable_status(response.status):
                retry_after = response.header("Retry-After")
                note(f"{method} {req_path}: {response.status}")
                continue
            note(f"{method} {req_path}: rejected {response.status} {response.body[:200]!r}")
            outcome = "rejected"
            break
        result[outcome] += 1
    transport.close()
    return result
