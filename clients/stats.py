"""What the client did, counted: the training loop is never told about a failure, so this is where
a user (or a test) looks.

Example::

    >>> s = ClientStats(logged=3, sent_records=2, dropped=1)
    >>> s.delivered_fraction
    0.6666666666666666
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ClientStats:
    """A snapshot of one ``Run``'s counters (counts unless the name says otherwise)."""

    logged: int = 0             # log() calls accepted (one per rank-step record)
    columns_logged: int = 0     # log_columns() calls accepted
    sent_records: int = 0       # records acknowledged (2xx) by the service
    sent_requests: int = 0      # requests acknowledged, all endpoints
    spooled_requests: int = 0   # requests written to the spool file (offline, or after giving up)
    dropped: int = 0            # queued items discarded because the queue was full (oldest first)
    retries: int = 0            # re-sent requests (after a connection error, timeout, 408/429/5xx)
    failed_requests: int = 0    # requests given up on after the last retry or at the exit deadline
    failed_records: int = 0     # records in those requests (lost unless spooled)
    rejected_requests: int = 0  # requests the service refused with a non-retryable 4xx
    invalid_fields: int = 0     # metric values that were not numbers, dropped from their record
    relayed_requests: int = 0   # metrics bodies the per-host relay confirmed (healthsvc_client.relay)
    relay_fallbacks: int = 0    # metrics bodies posted directly: the relay was missing, dead or slow
    heartbeats_sent: int = 0
    heartbeats_failed: int = 0
    ignored_calls: int = 0      # calls after finish(), in a forked child, or in disabled mode
    pending: int = 0            # items still queued when the snapshot was taken
    last_error: str | None = None

    @property
    def delivered_fraction(self) -> float:
        """sent_records / logged, in [0, 1]; 1.0 when nothing was logged."""
        return self.sent_records / self.logged if self.logged else 1.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Counters:
    """Mutable counters behind ``ClientStats``; each is written by one thread only. (Declared
    for the type checker; ``__init__`` sets every one of ClientStats' counts but those three.)"""

    logged: int
    columns_logged: int
    sent_records: int
    sent_requests: int
    spooled_requests: int
    retries: int
    failed_requests: int
    failed_records: int
    rejected_requests: int
    invalid_fields: int
    relayed_requests: int
    relay_fallbacks: int
    heartbeats_sent: int
    heartbeats_failed: int
    ignored_calls: int

    def __init__(self) -> None:
        for name in ClientStats.__dataclass_fields__:
            if name not in ("pending", "last_error", "dropped"):
                setattr(self, name, 0)
        self.last_error: str | None = None
