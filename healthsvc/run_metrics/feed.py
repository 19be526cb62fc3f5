"""What the per-run series take from the writer thread's after-commit results: the new batches."""
from __future__ import annotations

from typing import Any, Iterator


def new_batches(results: list[Any]) -> Iterator[tuple[Any, Any]]:
    """(result, batch) of each committed metrics batch that added records: a re-sent batch the
    store recognised (``duplicate``) and non-metrics writes (no ``batch``) add nothing."""
    for r in results:
        batch = getattr(r, "batch", None)
        if batch is not None and not getattr(r, "duplicate", False) and len(batch):
            yield r, batch
