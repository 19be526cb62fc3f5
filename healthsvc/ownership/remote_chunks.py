"""A push accepted by a replica that does not own its run, as the owner hears of it.

The announcement names the stored chunk (``{"chunks": [id]}``); a small chunk also travels inline,
its stored bytes (``IngestResult.payload``, base64) with its attempt and receive time, so the owner
feeds it without reading the store: with several replicas most pushes arrive elsewhere, and a read
per push was the largest part of what a push cost its owner. Whatever is not inline (a big chunk,
or one beyond a notification's share, :data:`INLINE_BYTES`) the owner reads by id. The chunk is
committed before it is announced, so either way the owner sees exactly what is stored.

>>> import numpy as np
>>> from healthsvc.store.batch import MetricBatch
>>> from healthsvc.store.codec import encode_chunk
>>> from healthsvc.store.results import IngestResult
>>> b = MetricBatch(np.array([7]), np.array([3]), {"loss": np.array([np.nan])}, {"loss": np.array([True])})
>>> msg = announcement(IngestResult("r", 1, False, 2, False, 41, 100.5, b, payload=encode_chunk(b)))
>>> fold(msg, announcement(IngestResult("r", 1, False, 2, False, 42, 100.6, b, payload=encode_chunk(b))))
>>> msg["chunks"], sorted(msg["inline"])
([41, 42], ['41', '42'])
>>> chunks, missing = inlined(msg)
>>> [(c.id, c.attempt, int(c.batch.steps[0]), int(c.batch.ranks[0])) for c in chunks], missing
([(41, 2, 7, 3), (42, 2, 7, 3)], [])
>>> bool(np.isnan(chunks[0].batch.values["loss"][0]) and chunks[0].batch.present["loss"][0])
True
"""
from __future__ import annotations

import base64
import logging

from healthsvc.ownership import RemoteMessage
from healthsvc.store.codec import decode_chunk
from healthsvc.store.results import IngestResult
from healthsvc.store.snapshots import StoredChunk

log = logging.getLogger(__name__)

INLINE_RECORDS = 64      # chunks of up to this many records travel inline (a relay's push is 8)
INLINE_BYTES = 4000      # inline text per run and notification (NOTIFY's payload limit is 8000)


def announcement(result: IngestResult) -> RemoteMessage:
    """What the owner is told of a stored metrics batch."""
    msg: RemoteMessage = {"chunks": [result.chunk_id]}
    if result.payload is not None and result.batch is not None and len(result.batch) <= INLINE_RECORDS:
        text = base64.b64encode(result.payload).decode()
        if len(text) <= INLINE_BYTES:
            msg["inline"] = {str(result.chunk_id): [result.attempt, result.received_at, text]}
    return msg


def fold(into: RemoteMessage, message: RemoteMessage) -> None:
    """Add ``message``'s chunks to ``into`` (one notification per run): every id, and its inline
    bytes while the run's inline text stays within :data:`INLINE_BYTES` (the rest are read)."""
    into["chunks"].extend(message["chunks"])
    extra = message.get("inline") or {}
    if not extra:
        return
    have = into.setdefault("inline", {})
    size = sum(len(entry[2]) for entry in have.values())
    for chunk_id, entry in extra.items():
        if size + len(entry[2]) > INLINE_BYTES:
            return
        have[chunk_id] = entry
        size += len(entry[2])


def inlined(message: RemoteMessage) -> tuple[list[StoredChunk], list[int]]:
    """The announced chunks that came inline, decoded, and the ids of the others (to read)."""
    inline = message.get("inline") or {}
    chunks, missing = [], []
    for chunk_id in sorted({int(c) for c in message.get("chunks", ()) if c is not None}):
        entry = inline.get(str(chunk_id))
        if entry is None:
            missing.append(chunk_id)
            continue
        try:
            attempt, received_at, text = entry
            chunks.append(StoredChunk(chunk_id, int(attempt), float(received_at),
                                      decode_chunk(base64.b64decode(text))))
        except Exception:  # noqa: BLE001 - a damaged entry: the chunk is in the store
            log.warning("chunk %s announced inline could not be decoded; reading it", chunk_id)
            missing.append(chunk_id)
    return chunks, missing
