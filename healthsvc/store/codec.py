"""Binary encoding of a columnar chunk of records (one stored row per accepted batch).

Layout: ``b"HSC2"``, a little-endian u32 header length, an orjson header, one block holding every
8-byte column side by side — step deltas, rank deltas, each metric's float64 values, host indices
— then the presence bitmaps of the metrics that have a missing value. String fields other than the
host (``MetricBatch.labels``, e.g. ``param_digest``) follow the host indices as index columns; their
distinct values are in the header.

The block is compressed with blosc2 (bit-shuffle + LZ4: a few GB/s, ~7 bytes per float point for
training metrics) in one call: blosc2's Python wrapper costs tens of microseconds per call, which
would dominate small batches if each column were compressed on its own. Blocks too small to gain
are stored raw.

Values are kept bit for bit as float64, so NaN and ±Inf survive; "not reported" is the separate
presence bitmap. The first release's chunks (``b"HSC1"``) are read by ``codec_v1``. Steps and ranks are stored as deltas, which compress to almost nothing for the
usual shapes (one step x many ranks, or many steps x one rank).
"""
from __future__ import annotations

import struct

import blosc2
import numpy as np
import orjson

from healthsvc.store.batch import MetricBatch
from healthsvc.store import codec_v1

MAGIC = b"HSC2"
RAW_BELOW_BYTES = 256  # smaller blocks are stored uncompressed
blosc2.set_nthreads(1)  # chunks are small; threads cost more than they save
_LZ4, _BITSHUFFLE = blosc2.Codec.LZ4, blosc2.Filter.BITSHUFFLE   # an enum member's lookup costs a call


def _delta(a: np.ndarray) -> np.ndarray:
    out = np.empty(len(a), dtype=np.int64)
    if len(a):
        out[0] = a[0]
        np.subtract(a[1:], a[:-1], out=out[1:])
    return out


def encode_chunk(batch: MetricBatch) -> bytes:
    n = len(batch)
    names = list(batch.values)
    has_hosts = batch.host_index is not None
    labels = list(batch.labels)
    rows = 2 + len(names) + has_hosts + len(labels)
    if n == 1 and 8 * rows < RAW_BELOW_BYTES:
        return _encode_one_record(batch, names, has_hosts, labels)
    return _encode_columns(batch, names, has_hosts, labels)


def _encode_columns(batch: MetricBatch, names: list[str], has_hosts: bool, labels: list[str]) -> bytes:
    n = len(batch)
    block = np.empty((2 + len(names) + has_hosts + len(labels), n), dtype=np.float64)
    ints = block.view(np.int64)
    ints[0] = _delta(batch.steps)
    ints[1] = _delta(batch.ranks)
    missing = []
    bitmaps = []
    partial = batch.partial_fields
    for i, name in enumerate(names):
        if name not in partial:
            block[2 + i] = batch.values[name]
        else:
            present = batch.present[name]
            # Zero filler compresses better than NaN filler and is never read: the bitmap decides.
            np.copyto(block[2 + i], 0.0)
            np.copyto(block[2 + i], batch.values[name], where=present)
            missing.append(name)
            bitmaps.append(np.packbits(present).tobytes())
    if batch.host_index is not None:
        ints[2 + len(names)] = batch.host_index
    for j, name in enumerate(labels):
        ints[2 + len(names) + has_hosts + j] = batch.labels[name][1]
    raw = block.tobytes()
    data = raw
    if len(raw) >= RAW_BELOW_BYTES:
        packed = blosc2.compress(raw, typesize=8, clevel=1, codec=_LZ4, filter=_BITSHUFFLE)
        if len(packed) < len(raw):   # a few records of noisy values can come out larger (blosc2's header)
            data = packed
    compressed = data is not raw
    return _framed(batch, names, missing, has_hosts, labels, compressed, data, bitmaps)


def _framed(batch: MetricBatch, names: list[str], missing: list[str], has_hosts: bool, labels: list[str],
            compressed: bool, data: bytes, bitmaps: list[bytes]) -> bytes:
    header = orjson.dumps({"n": len(batch), "fields": names, "missing": missing,
                           "hosts": batch.host_names if has_hosts else None, "compressed": compressed,
                           "size": len(data), **({"labels": {f: batch.labels[f][0] for f in labels}} if labels else {})})
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, data, *bitmaps])


_NOT_PRESENT = np.packbits([False]).tobytes()


def _encode_one_record(batch: MetricBatch, names: list[str], has_hosts: bool, labels: list[str]) -> bytes:
    """:func:`encode_chunk` of one record (a rank's own push), byte for byte, without building
    the block column by column: a small raw block (``tests/service/test_codec.py`` holds the two
    to the same bytes)."""
    values = np.empty(len(names), dtype=np.float64)
    missing = []
    for i, name in enumerate(names):
        if batch.present[name][0]:
            values[i] = batch.values[name][0]
        else:
            values[i] = 0.0   # as the block's filler
            missing.append(name)
    ints = ([int(batch.host_index[0])] if batch.host_index is not None else []) + [int(batch.labels[f][1][0]) for f in labels]
    data = b"".join([struct.pack("<qq", int(batch.steps[0]), int(batch.ranks[0])), values.tobytes(),
                     struct.pack(f"<{len(ints)}q", *ints)])
    return _framed(batch, names, missing, has_hosts, labels, False, data, [_NOT_PRESENT] * len(missing))


def decode_chunk(buf: bytes, fields: set[str] | None = None) -> MetricBatch:
    """Decode a chunk (of any release); with ``fields`` only those metric columns are returned."""
    if buf[:4] != MAGIC:
        if buf[:4] == codec_v1.MAGIC:
            return codec_v1.decode_chunk_v1(buf, fields)
        raise ValueError(f"not a healthsvc chunk (starts with {bytes(buf[:4])!r})")
    (hlen,) = struct.unpack_from("<I", buf, 4)
    header = orjson.loads(buf[8:8 + hlen])
    n, names = header["n"], header["fields"]
    start = 8 + hlen
    data = buf[start:start + header["size"]]
    raw = blosc2.decompress(data) if header["compressed"] else data
    rows = 2 + len(names) + (header["hosts"] is not None) + len(header.get("labels") or {})
    block = np.frombuffer(raw, dtype=np.float64).reshape(-1, n) if n else np.zeros((rows, 0))
    ints = block.view(np.int64)
    batch = MetricBatch(steps=np.cumsum(ints[0]), ranks=np.cumsum(ints[1]))
    offset = start + header["size"]
    nbytes = (n + 7) // 8
    bitmaps = {}
    for name in header["missing"]:
        bitmaps[name] = np.unpackbits(np.frombuffer(buf, np.uint8, nbytes, offset), count=n).astype(bool)
        offset += nbytes
    for i, name in enumerate(names):
        if fields is not None and name not in fields:
            continue
        if name in bitmaps:
            present = bitmaps[name]
            batch.values[name] = np.where(present, block[2 + i], np.nan)
        else:
            present = np.ones(n, dtype=bool)
            batch.values[name] = block[2 + i].copy()
        batch.present[name] = present
    # The fields with a bitmap are those some record did not report (what encode_chunk read
    # from partial_fields): known here, not read back from the masks.
    batch.partial_fields = frozenset(name for name in bitmaps if name in batch.present)
    has_hosts = header["hosts"] is not None
    if has_hosts:
        batch.host_names = header["hosts"]
        batch.host_index = ints[2 + len(names)].astype(np.int32)
    for j, (name, values) in enumerate((header.get("labels") or {}).items()):
        if fields is None or name in fields:
            batch.labels[name] = (values, ints[2 + len(names) + has_hosts + j].astype(np.int32))
    return batch
