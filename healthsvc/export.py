"""Columnar export of a run's history: CSV and Apache Arrow, streamed chunk by chunk.

Arrow keeps the two absences apart natively: a missing value is null (validity bitmap), a NaN is a
NaN float. CSV writes ``nan``, ``inf``, ``-inf`` and leaves a missing value empty. Both are
written by pyarrow's C++ writers: formatting floats in Python costs ~1 µs per value, which is
seconds for a large run.
"""
from __future__ import annotations

import io
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as paipc

from healthsvc_client.wire import LABEL_FIELDS
from healthsvc.store.batch import MetricBatch

ARROW_MEDIA_TYPE = "application/vnd.apache.arrow.stream"


def arrow_schema(fields: list[str], has_hosts: bool) -> pa.Schema:
    cols = [pa.field("step", pa.int64()), pa.field("rank", pa.int64()), pa.field("attempt", pa.int64())]
    if has_hosts:
        cols.append(pa.field("host", pa.string()))
    cols += [pa.field(f, pa.string() if f in LABEL_FIELDS else pa.float64()) for f in fields]
    return pa.schema(cols)


def to_record_batch(schema: pa.Schema, attempt: int, batch: MetricBatch) -> pa.RecordBatch:
    n = len(batch)
    arrays: list[pa.Array] = [pa.array(batch.steps), pa.array(batch.ranks), pa.array(np.full(n, attempt, np.int64))]
    names = schema.names[3:]
    if names and names[0] == "host":
        names = names[1:]
        if batch.host_index is None:
            arrays.append(pa.nulls(n, pa.string()))
        else:
            dictionary = pa.array(batch.host_names, pa.string())
            idx = pa.array(batch.host_index, mask=batch.host_index < 0)
            arrays.append(pa.DictionaryArray.from_arrays(idx, dictionary).cast(pa.string()) if len(batch.host_names)
                          else pa.nulls(n, pa.string()))
    for f in names:
        if f in LABEL_FIELDS:
            arrays.append(pa.array(batch.label_column(f), pa.string()) if f in batch.labels
                          else pa.nulls(n, pa.string()))
        elif f in batch.values:
            present = batch.present[f]
            arrays.append(pa.array(batch.values[f], mask=None if present.all() else ~present))
        else:
            arrays.append(pa.nulls(n, pa.float64()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class _Sink(io.RawIOBase):
    """A write-only buffer that hands out what was written since the last take()."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self._parts.append(bytes(b))
        return len(b)

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


def stream(fmt: str, schema: pa.Schema, batches: Iterable[tuple[int, MetricBatch]]) -> Iterator[bytes]:
    """Encode ``(attempt, batch)`` pairs as one CSV or Arrow stream, yielding bytes per chunk."""
    sink = _Sink()
    if fmt == "csv":
        writer = pacsv.CSVWriter(sink, schema, write_options=pacsv.WriteOptions(quoting_style="needed"))
    elif fmt == "arrow":
        writer = paipc.new_stream(sink, schema)
    else:
        raise ValueError(f"unknown export format {fmt!r}")
    yield sink.take()
    for attempt, batch in batches:
        writer.write_batch(to_record_batch(schema, attempt, batch))
        data = sink.take()
        if data:
            yield data
    writer.close()
    yield sink.take()
