"""Snapshot and replay: how in-memory state outlives a restart, in one place for every owner.

Three owners keep per-run state in memory and rebuild it on start the same way: the ingest's
:class:`~healthsvc.store.runstate.RunState` (``kind="ingest"``), the run monitors (``"monitor"``)
and the dashboard's rollups (``"dashboard"``). Each writes, now and then, a snapshot of its state
with a *watermark* (the id of the last stored chunk the state includes); on start it loads the
snapshot and replays the chunks stored after the watermark, so nothing is lost and nothing is
counted twice. A snapshot is an optimisation: without one the whole history is replayed, and
one the owner cannot read (an earlier release's form) is replayed past the same way, never a
reason not to start (:func:`replaying_past`).

The table is ``run_state`` (``schema.py``); these are the only functions that touch it.
"""
from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

from healthsvc.store.batch import MetricBatch
from healthsvc.store.codec import decode_chunk

SnapshotKind = Literal["ingest", "monitor", "dashboard"]

log = logging.getLogger(__name__)


def replaying_past(kind: SnapshotKind, run_id: str, exc: BaseException) -> None:
    """Say (one WARNING line: nothing is lost, so no traceback) that a run's snapshot could not be
    read and its history is replayed instead. Snapshots of earlier releases lack what newer
    state has; the replay rebuilds it from the chunks."""
    log.warning("%s snapshot of run %s unreadable (%s: %s, e.g. written by an earlier release); "
                "replaying its history instead", kind, run_id, type(exc).__name__, str(exc)[:200])


@dataclass(frozen=True)
class Snapshot:
    """One owner's saved state of one run: the state's bytes, and the id of the last chunk in it."""
    watermark: int
    state: bytes


@dataclass(frozen=True)
class StoredChunk:
    """A stored metrics chunk as replay hands it on (what the ingest accepted, in order)."""
    id: int
    attempt: int
    received_at: float            # service clock, unix seconds
    batch: MetricBatch


def write_snapshot(conn: sqlite3.Connection, run_id: str, kind: SnapshotKind, watermark: int,
                   state: bytes) -> None:
    conn.execute("INSERT OR REPLACE INTO run_state VALUES (?, ?, ?, ?)", (run_id, kind, watermark, state))


def newest_chunk_id(conn: sqlite3.Connection, run_id: str) -> int:
    (watermark,) = conn.execute("SELECT coalesce(max(id), 0) FROM chunks WHERE run_id=?", (run_id,)).fetchone()
    return int(watermark)


def read_snapshots(conn: sqlite3.Connection, kind: SnapshotKind, run_id: str | None = None) -> dict[str, Snapshot]:
    """Every run's snapshot of one owner (or only ``run_id``'s), by run id."""
    if run_id is not None:
        return {r: Snapshot(int(w), bytes(s)) for r, w, s in conn.execute(
            "SELECT run_id, watermark, state FROM run_state WHERE kind=? AND run_id=?", (kind, run_id))}
    return {r: Snapshot(int(w), bytes(s)) for r, w, s in conn.execute(
        "SELECT run_id, watermark, state FROM run_state WHERE kind=?", (kind,))}


# Ids per read of named chunks: a statement's parameters stay few (and the statement's text,
# which the PostgreSQL driver prepares, one of a few lengths).
BY_ID_LIMIT = 64


def chunks_by_id(conn: sqlite3.Connection, run_id: str, ids: Sequence[int],
                 fields: set[str] | None = None) -> Iterator[StoredChunk]:
    """The run's chunks among ``ids`` (the few a notification named), oldest first, each read
    fetched whole: one round trip where a stream of the chunks after a watermark takes several
    (PostgreSQL: a server-side cursor)."""
    ids = sorted({int(i) for i in ids})
    for at in range(0, len(ids), BY_ID_LIMIT):
        part = ids[at:at + BY_ID_LIMIT]
        rows = conn.execute(
            f"SELECT id, attempt, received_at, payload FROM chunks WHERE run_id=? AND id IN ({', '.join('?' * len(part))})"
            " ORDER BY id", (run_id, *part)).fetchall()
        for chunk_id, attempt, received_at, payload in rows:
            yield StoredChunk(chunk_id, attempt, received_at, decode_chunk(payload, fields))


def chunks_after(conn: sqlite3.Connection, run_id: str, watermark: int,
                 fields: set[str] | None = None) -> Iterator[StoredChunk]:
    """The run's chunks stored after ``watermark``, oldest first; ``fields`` limits the metric
    columns decoded (an empty set decodes steps, ranks and hosts only)."""
    for chunk_id, attempt, received_at, payload in conn.execute(
            "SELECT id, attempt, received_at, payload FROM chunks WHERE run_id=? AND id>? ORDER BY id",
            (run_id, watermark)):
        yield StoredChunk(chunk_id, attempt, received_at, decode_chunk(payload, fields))
