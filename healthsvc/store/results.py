"""What a committed store write hands on: the typed messages of the pipeline's first stage.

The writer thread passes every committed job's result to the store's after-commit listeners
(``SQLiteStore.subscribe``); the monitor, the dashboard and alerting pick the messages they need.
"""
from __future__ import annotations

from dataclasses import dataclass

from healthsvc.store.batch import MetricBatch
from healthsvc.store.runstate import RunView


@dataclass
class IngestResult:
    """What one accepted metrics batch did; also handed to after-commit listeners."""
    run_id: str
    accepted: int
    duplicate: bool
    attempt: int
    new_attempt: bool
    chunk_id: int | None
    received_at: float
    batch: MetricBatch | None = None
    run: RunView | None = None     # the run's committed state after this batch
    payload: bytes | None = None   # the chunk as stored (``codec.encode_chunk``)


@dataclass(frozen=True)
class RunsReleased:
    """The store let go of these runs' ingest state (finished and quiet here; see
    ``release_run_states``): the other holders of per-run memory let go of theirs."""
    run_ids: tuple[str, ...]


@dataclass
class RunEvent:
    """A non-metrics write that listeners (the run monitor) care about."""
    run_id: str
    kind: str                      # "heartbeat" | "finish" | "config" | "event" | "checkpoint"
    data: dict
    received_at: float
    run: RunView | None = None     # the run's committed state after this write
