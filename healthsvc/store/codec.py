"""Binary encoding of a columnar chunk of records (one stored row per accepted batch).

Layout: ``b"HSC1"``, a little-endian u32 header length, an orjson header, then the sections the
header lists, each compressed with blosc2 (LZ4 after a shuffle filter; a few GB/s, so compression
costs the hot path little and keeps storage near 7 bytes per float point).

Values are kept bit for bit as float64, so NaN and ±Inf survive; "not reported" is a separate
presence bitmap, written only for fields that have a missing value. Steps and ranks are stored as
deltas, which compress to almost nothing for the usual shapes (one step x many ranks, or many
steps x one rank).
"""
from __future__ import annotations

import struct

import blosc2
import numpy as np
import orjson

from healthsvc.ingest.batch import MetricBatch

MAGIC = b"HSC1"
blosc2.set_nthreads(1)  # chunks are small; threads cost more than they save


def _pack(arr: np.ndarray, *, bitshuffle: bool = False) -> bytes:
    filt = blosc2.Filter.BITSHUFFLE if bitshuffle else blosc2.Filter.SHUFFLE
    return blosc2.compress(np.ascontiguousarray(arr), typesize=arr.dtype.itemsize, clevel=1,
                           codec=blosc2.Codec.LZ4, filter=filt)


def _unpack(buf: bytes, dtype) -> np.ndarray:
    return np.frombuffer(blosc2.decompress(buf), dtype=dtype)


def _delta(a: np.ndarray) -> np.ndarray:
    out = np.empty_like(a)
    if a.size:
        out[0] = a[0]
        np.subtract(a[1:], a[:-1], out=out[1:])
    return out


def encode_chunk(batch: MetricBatch) -> bytes:
    sections: list[bytes] = [_pack(_delta(batch.steps)), _pack(_delta(batch.ranks))]
    fields = []
    for name, values in batch.values.items():
        present = batch.present[name]
        has_missing = not bool(present.all())
        if has_missing:
            # Zero filler compresses better than NaN filler and can never be mistaken for data:
            # the presence bitmap decides.
            values = np.where(present, values, 0.0)
        sections.append(_pack(values, bitshuffle=True))
        if has_missing:
            sections.append(np.packbits(present).tobytes())
        fields.append([name, has_missing])
    hosts = None
    if batch.host_index is not None:
        hosts = batch.host_names
        sections.append(_pack(batch.host_index))
    header = orjson.dumps({"n": len(batch), "fields": fields, "hosts": hosts,
                           "sizes": [len(s) for s in sections]})
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *sections])


def decode_chunk(buf: bytes, fields: set[str] | None = None) -> MetricBatch:
    """Decode a chunk; with ``fields`` only those metric columns are decompressed."""
    if buf[:4] != MAGIC:
        raise ValueError("not a healthsvc chunk")
    (hlen,) = struct.unpack_from("<I", buf, 4)
    header = orjson.loads(buf[8:8 + hlen])
    n = header["n"]
    offsets = np.concatenate([[8 + hlen], 8 + hlen + np.cumsum(header["sizes"])]).tolist()
    section = iter(range(len(header["sizes"])))

    def raw() -> bytes:
        i = next(section)
        return buf[offsets[i]:offsets[i + 1]]

    steps = np.cumsum(_unpack(raw(), np.int64))
    ranks = np.cumsum(_unpack(raw(), np.int64))
    batch = MetricBatch(steps=steps, ranks=ranks)
    for name, has_missing in header["fields"]:
        if fields is not None and name not in fields:
            raw()
            if has_missing:
                raw()
            continue
        values = _unpack(raw(), np.float64)
        if has_missing:
            present = np.unpackbits(np.frombuffer(raw(), dtype=np.uint8), count=n).astype(bool)
            values = np.where(present, values, np.nan)
        else:
            present = np.ones(n, dtype=bool)
        batch.values[name], batch.present[name] = values, present
    if header["hosts"] is not None:
        batch.host_names = header["hosts"]
        batch.host_index = _unpack(raw(), np.int32)
    return batch
