"""Fenced writes: a write that only the current owner of a run may make carries its lease.

The store checks the fence in the write's own transaction, first: :data:`FENCE_SQL` locks the
run's lease row ``FOR SHARE`` (a takeover, an UPDATE of the row, waits until the write committed)
and finds nothing when the lease's token moved on, and then the write fails with
:class:`LeaseLost` and rolls back, so a replica that lost the run cannot overwrite the new
owner's snapshot or findings. Who holds which lease is :mod:`healthsvc.ownership`'s business; the
store knows only the lease table's row and this check.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The database's clock, in the lease table's unit (unix seconds): one clock for every replica.
DB_NOW = "extract(epoch FROM clock_timestamp())::float8"


@dataclass(frozen=True)
class Fence:
    """A held lease as the owner's writes carry it: a write is applied only while the run's
    lease still has this ``token``."""
    run_id: str
    owner: str
    token: int


#: Run first in a fenced write's transaction, with (run_id, owner, token): no row means the
#: writer lost the run (raise :class:`LeaseLost`, roll back). ``FOR SHARE``: a takeover (an
#: UPDATE of the row) waits until the fenced write committed.
FENCE_SQL = f"""
SELECT 1 FROM leases WHERE run_id = %s AND owner = %s AND token = %s AND expires_at > {DB_NOW} FOR SHARE
"""


class LeaseLost(RuntimeError):
    """A fenced write came from a replica that no longer owns the run."""


def check_fence(cur: Any, fence: Fence | None) -> None:
    """In a write's transaction: lock the lease of ``fence`` or raise :class:`LeaseLost`."""
    if fence is None:
        return
    if cur.execute(FENCE_SQL, (fence.run_id, fence.owner, fence.token)).fetchone() is None:
        raise LeaseLost(f"run {fence.run_id}: lease token {fence.token} of {fence.owner} is no longer valid")
