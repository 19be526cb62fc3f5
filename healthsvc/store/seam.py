"""What a table of the store needs of the store: its writer thread and a connection to read through.

The tables (``findings``, ``bisections``, ``probes``, ``tokens`` and the audit log) are small
classes that own their SQL. Each is built with a :class:`TableAccess` (the store, seen through
these two methods only) and what else it needs by name (a clock, the run's hosts), and is held
by the store as an attribute (``store.findings``): no table reads another's attributes or the
store's.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Protocol

from healthsvc.store.fencing import Fence

Clock = Callable[[], float]   # unix seconds


class TableAccess(Protocol):
    def write(self, job: Callable[[Any], Any], fence: Fence | None = None) -> Future:
        """Run ``job(conn)`` on the writer thread in the next group commit; resolves to its result
        once durable (``fence``: only while that lease holds)."""
        ...

    def read_conn(self) -> Any:
        """A connection owned by the calling thread, for reads (sqlite3's, or PostgreSQL's pooled
        reader: both take the store's SQLite-dialect SQL)."""
        ...
