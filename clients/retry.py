"""When to retry a request and how long to wait first.

Retried: connection errors, timeouts, 408, 429 and 5xx. Not retried: other 4xx (the body is wrong;
sending it again cannot help). Waits grow exponentially with full jitter (so thousands of ranks
that lost the service at the same moment do not come back in lockstep), and a ``Retry-After``
header, in seconds or as an HTTP date, overrides the computed wait (capped at ``max_s``).

Example::

    >>> import random
    >>> b = Backoff(base_s=0.5, max_s=8.0, rng=random.Random(0))
    >>> [round(b.delay_s(n), 2) for n in range(4)]   # attempt 0, 1, 2, 3
    [0.46, 0.88, 1.42, 2.52]
    >>> b.delay_s(0, retry_after="3")
    3.0
"""
from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass, field

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def is_retryable_status(status: int) -> bool:
    """True for statuses where the same request may succeed later."""
    return status in RETRYABLE_STATUSES or status >= 500


def parse_retry_after_s(value: str | None, now_s: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date); None if absent
    or unparseable. ``now_s`` is unix seconds (injectable for tests)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    now = time.time() if now_s is None else now_s
    return max(0.0, when.timestamp() - now)


@dataclass
class Backoff:
    """Exponential backoff with full jitter: attempt n waits uniform(0.5, 1) * min(max_s, base_s * 2**n).

    The lower half is kept (not full [0, 1) jitter) so a retry never fires immediately.
    """

    base_s: float = 0.25
    max_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)

    def delay_s(self, attempt: int, retry_after: str | None = None) -> float:
        hinted = parse_retry_after_s(retry_after)
        if hinted is not None:
            return min(hinted, self.max_s)
        ceiling = min(self.max_s, self.base_s * (2.0 ** attempt))
        return ceiling * self.rng.uniform(0.5, 1.0)
