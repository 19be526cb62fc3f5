"""What a change to the alert state writes, as plain data: built on the thread that made the
change (``Outbox.collect``), applied by whichever writer job carries it (the change's own, or the
findings job that caused it)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)


@dataclass
class Ops:
    """The statements to run in one writer job (:func:`apply_ops`, in any job), and what to run
    once that job ended, told whether it is durable (hand a page to the delivery worker or give
    its reservation back, tell a run's owner)."""
    statements: list[tuple[str, tuple]] = field(default_factory=list)
    after: list[Callable[[bool], None]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.statements or self.after)

    def ended(self, durable: bool) -> None:
        """The job that applied these ended: run :attr:`after`, told whether it is durable."""
        for callback in self.after:
            try:
                callback(durable)
            except Exception:  # noqa: BLE001 - one hand-off must not stop the others
                log.exception("an after-commit callback of an alert change failed")


def apply_ops(conn: Any, ops: Ops) -> None:
    """Run ``ops``' statements on ``conn``, inside the caller's job."""
    for sql, args in ops.statements:
        conn.execute(sql, args)
