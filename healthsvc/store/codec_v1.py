"""Reading chunks of the first release (``b"HSC1"``), whose databases are still upgraded in place.

Layout: ``b"HSC1"``, a little-endian u32 header length, an orjson header (``n``, ``fields`` as
``[name, has_missing]`` pairs, ``hosts``, ``sizes``), then its sections in order, each compressed
with blosc2 on its own: step deltas, rank deltas, per metric its float64 values (then its presence
bitmap, raw, when it has a missing value), then the host indices (int32). Written no more since
the one-block codec (``codec``, ``b"HSC2"``); only read.
"""
from __future__ import annotations

import struct

import blosc2
import numpy as np
import orjson

from healthsvc.store.batch import MetricBatch

MAGIC = b"HSC1"


def decode_chunk_v1(buf: bytes, fields: set[str] | None = None) -> MetricBatch:
    """Decode a first-release chunk; with ``fields`` only those metric columns are returned."""
    (hlen,) = struct.unpack_from("<I", buf, 4)
    header = orjson.loads(buf[8:8 + hlen])
    n = header["n"]
    bounds = np.concatenate([[8 + hlen], 8 + hlen + np.cumsum(header["sizes"], dtype=np.int64)]).tolist()
    sections = iter(buf[a:b] for a, b in zip(bounds[:-1], bounds[1:]))

    def unpack(dtype) -> np.ndarray:
        return np.frombuffer(blosc2.decompress(next(sections)), dtype=dtype)

    batch = MetricBatch(steps=np.cumsum(unpack(np.int64)), ranks=np.cumsum(unpack(np.int64)))
    for name, has_missing in header["fields"]:
        if fields is not None and name not in fields:
            next(sections)
            if has_missing:
                next(sections)
            continue
        values = unpack(np.float64)
        present = np.ones(n, dtype=bool)
        if has_missing:
            present = np.unpackbits(np.frombuffer(next(sections), dtype=np.uint8), count=n).astype(bool)
            values = np.where(present, values, np.nan)
        batch.values[name], batch.present[name] = values.copy(), present
    if header["hosts"] is not None:
        batch.host_names = header["hosts"]
        batch.host_index = unpack(np.int32).copy()
    return batch
