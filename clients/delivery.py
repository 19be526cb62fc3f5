"""One request to the service, delivered at least once: encoded, gzipped, retried, or spooled.

Used by a rank's sender thread (``healthsvc_client.sender``) and by the per-host relay (``healthsvc_client.relay``).
The body is encoded once and retried byte for byte: a metrics body carries a ``batch_id``, so a
server that deduplicates never counts a retried batch twice. Retries back off exponentially with
jitter and honour ``Retry-After`` (``healthsvc_client.retry``); a close deadline (``deadline``, monotonic
seconds, set when the run closes) cuts the waits and the request timeouts short. A request given
up on is appended to the spool file when there is one. Never raises: outcomes are counted.

Example::

    >>> from healthsvc_client.stats import Counters
    >>> from healthsvc_client.transport import MockTransport, Response
    >>> from healthsvc_client.retry import Backoff
    >>> answers = iter([Response(503), Response(202)])
    >>> t = MockTransport(lambda req: next(answers))
    >>> d = Delivery(mode="online", transport=t, spool=None, backoff=Backoff(0.001, 0.001),
    ...              max_attempts=3, timeout_s=1.0, gzip_min_bytes=-1, counters=Counters(),
    ...              problem=lambda key, message: None)
    >>> d.deliver("POST", "/v1/runs/r/metrics", {"batch_id": "b1", "records": []}, n_records=0)
    True
    >>> d.counters.retries, t.requests[0].body == t.requests[1].body
    (1, True)
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from healthsvc_client import encode
from healthsvc_client.retry import Backoff, is_retryable_status
from healthsvc_client.spool import SpoolWriter
from healthsvc_client.stats import Counters
from healthsvc_client.transport import Request, Transport, TransportError


Outcome = Literal["sent", "spooled", "rejected", "failed"]


class Delivery:
    """Delivers requests for one client (a rank's ``Run`` or the relay); see the module docstring.

    ``problem(key, message)`` reports a failure (logged once per key by the owner).
    """

    def __init__(self, *, mode: str, transport: Transport | None, spool: SpoolWriter | None,
                 backoff: Backoff, max_attempts: int, timeout_s: float, gzip_min_bytes: int,
                 counters: Counters, problem: Callable[[str, str], None]) -> None:
        self.mode = mode
        self.transport = transport
        self.spool = spool
        self.backoff = backoff
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.gzip_min_bytes = gzip_min_bytes
        self.counters = counters
        self.problem = problem
        self.interrupt = threading.Event()   # set on close: a backoff wait re-reads the deadline
        self.deadline: float | None = None   # monotonic; None until the owner closes

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def sleep_s(self, delay_s: float) -> bool:
        """Wait up to ``delay_s`` (cut short by the close deadline); False when out of time."""
        end = time.monotonic() + delay_s
        while True:
            now = time.monotonic()
            limit = end if self.deadline is None else min(end, self.deadline)
            if now >= limit:
                return not self.out_of_time()
            if self.interrupt.wait(limit - now):
                self.interrupt.clear()

    def deliver(self, method: str, path: str, body: Any, n_records: int) -> bool:
        """True once the service accepted the request (offline: once it is in the spool)."""
        outcome = self.send(method, path, body, n_records)
        return outcome == "sent" or (outcome == "spooled" and self.mode == "offline")

    def send(self, method: str, path: str, body: Any, n_records: int) -> Outcome:
        """Deliver and say how it ended: ``"sent"`` (accepted), ``"spooled"`` (offline, or given
        up on and kept in the spool), ``"rejected"`` (refused with a 4xx, or not encodable:
        sending it again cannot help) or ``"failed"`` (given up on, and no spool kept it)."""
        c = self.counters
        if self.mode == "offline":
            return "spooled" if self.to_spool(method, path, body, failed=False) else "failed"
        try:
            payload, headers = encode.maybe_gzip(encode.encode_json(body), self.gzip_min_bytes)
        except (TypeError, ValueError) as exc:
            c.rejected_requests += 1
            self.problem("encode", f"could not encode a {path} body: {exc!r}")
            return "rejected"
        request = Request(method, path, payload, {"Content-Type": "application/json", **headers})
        retry_after: str | None = None
        for attempt in range(self.max_attempts):
            if attempt:
                if not self.sleep_s(self.backoff.delay_s(attempt - 1, retry_after)):
                    break
                c.retries += 1
            if self.out_of_time():
                break
            timeout_s = self.timeout_s
            if self.deadline is not None:
                timeout_s = max(0.001, min(timeout_s, self.deadline - time.monotonic()))
            retry_after = None
            try:
                response = self.transport.request(request, timeout_s)  # type: ignore[union-attr]
            except TransportError as exc:  # its message names the method and path
                self.problem("transport", str(exc))
                continue
            except Exception as exc:  # a transport bug is handled like a network error
                self.problem("transport", f"{method} {path}: {exc!r}")
                continue
            if 200 <= response.status < 300:
                c.sent_requests += 1
                c.sent_records += n_records
                return "sent"
            if is_retryable_status(response.status):
                retry_after = response.header("Retry-After")
                self.problem(f"status{response.status}", f"{method} {path} answered {response.status}")
                continue
            c.rejected_requests += 1
            self.problem(f"status{response.status}",
                         f"{method} {path} rejected with {response.status}: {response.body[:300]!r}")
            return "rejected"
        c.failed_requests += 1
        c.failed_records += n_records
        if self.spool is not None and self.to_spool(method, path, body, failed=True):
            return "spooled"
        return "failed"

    def to_spool(self, method: str, path: str, body: Any, failed: bool) -> bool:
        try:
            self.spool.write(method, path, body)  # type: ignore[union-attr]
        except OSError as exc:
            self.problem("spool", f"could not write the spool: {exc!r}")
            if not failed:
                self.counters.failed_requests += 1
            return False
        self.counters.spooled_requests += 1
        return True
