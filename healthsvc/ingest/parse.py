"""Parse a metrics body (rows or columns form) straight into numpy columns.

The columns form of a well-formed push (what relays and aggregators send: the big pushes) is read
by simdjson straight into numpy, one buffer per column, without a Python object per value
(:func:`_numeric_columns`: at 1,024 records a push, half the cost of decoding with orjson and
converting with ``np.array``). Anything it does not take as it is (a null, a string among numbers,
a NaN token, a nested list, a repeated key, a body of another shape) goes the general way,
which decides what is accepted and words every error: ``orjson`` decodes the body (the Python
``json`` module only when the body carries NaN/Infinity tokens, which orjson rejects), and each
column becomes a numpy array in one ``np.array`` call. Per-element Python work happens only for
columns that hold nulls, strings or values of the wrong type, so that the error can name the
exact element.

Accepted values of a numeric field: a JSON number, the tokens ``NaN``/``Infinity``/``-Infinity``,
the strings ``"NaN"``/``"Infinity"``/``"-Infinity"``; ``null`` or an absent key means "not
reported". Booleans and other strings are rejected; ``step`` and ``rank`` must be integers below
2**63 (``true`` is never one; rank also below ``max_ranks``). In a metric column a boolean mixed
with numbers is accepted as 0/1 by numpy's conversion and not caught: a documented leniency of
the fast path (checking every element's type would cost each push several per cent).
"""
from __future__ import annotations

import json
import re
import zlib
from operator import itemgetter
from typing import Any

import numpy as np
import orjson
import simdjson
import xxhash

from healthsvc_client.wire import INTEGER_FIELDS, KEY_FIELDS, LABEL_FIELDS, NON_FINITE_STRINGS, STRING_FIELDS
from healthsvc.errors import BadRequest, InvalidInput, PayloadTooLarge
from healthsvc.store.batch import MetricBatch, all_present

FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
RESERVED_FIELDS = frozenset({"attempt", "batch_id"})
TOP_LEVEL_KEYS = ("records", "columns", "batch_id")
# Bodies from this size on are worth the fast columns decode. Alone (timeit of parse_metrics)
# it is cheaper from about 30 records (4 KB) on; in the service, whose every thread's CPU a push
# costs, it is not until about 384 records (45 KB): bench/ingest_inproc.py's CPU per push with
# the fast decode / without (this threshold set by hand for each case), columns of 64 records 0.55 / 0.43 ms, 128 0.54 / 0.45, 256 0.67 /
# 0.56, 384 0.66 / 0.65, 512 0.82 / 0.97, 1,024 1.2 / 1.6 (stop 40, two runs each; why a small
# body costs more through simdjson there than alone is not known).
FAST_COLUMNS_MIN_BYTES = 48 * 1024


def decode_body(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """Undo ``Content-Encoding: gzip`` with a cap on the inflated size (no zip bombs)."""
    enc = (content_encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ("gzip", "x-gzip", "deflate"):
        raise BadRequest(f"unsupported Content-Encoding {content_encoding!r}",
                         loc=("header", "content-encoding"), hint="send gzip or identity")
    wbits = 16 + zlib.MAX_WBITS if enc != "deflate" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise BadRequest(f"body is not valid {enc}: {exc}", loc=("body",)) from None
    if len(out) > max_bytes:
        raise PayloadTooLarge(f"inflated body exceeds the limit of {max_bytes} bytes", loc=("body",),
                              hint="split the batch into smaller requests")
    return out


def load_json(body: bytes) -> Any:
    """Decode JSON, accepting the NaN/Infinity/-Infinity tokens Python's json writes."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        # The json module accepts NaN/Infinity tokens; it is only reached for such bodies
        # (or broken ones), so the common case stays on orjson.
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}", loc=("body",)) from None


def body_digest(body: bytes, doc: dict) -> str:
    """Idempotency key: the client's ``batch_id`` when given, else a hash of the body."""
    batch_id = doc.get("batch_id")
    if batch_id is not None:
        return "id:" + str(batch_id)
    # 128-bit xxh3: ~10 GB/s, so hashing costs the hot path nothing; collisions are negligible.
    return "h:" + xxhash.xxh3_128_hexdigest(body)


def parse_metrics(body: bytes, max_ranks: int = 1 << 20, max_names: int = 1 << 20) -> tuple[MetricBatch, str]:
    """Parse a decoded body into a batch and its idempotency key. Raises 400/422 errors.

    Rank ids must be below ``max_ranks`` and a reported ``world_size`` at most that; a batch
    names at most ``max_names`` fields besides ``step``, ``rank`` and ``host`` (checked before any
    column is built: 300,000 names in one push cost 158 MiB)."""
    fast = _numeric_columns(body, max_names)
    if fast is not None:
        columns, n, batch_id = fast
        where = _Where(("body", "columns"), rows=False)
        batch = _build_batch(columns, n, where)
        _check_ranks(batch, max_ranks, where)
        return batch, body_digest(body, {"batch_id": batch_id})
    doc = load_json(body)
    if not isinstance(doc, dict):
        raise InvalidInput("body must be a JSON object with 'records' or 'columns'", loc=("body",))
    unknown = [k for k in doc if k not in TOP_LEVEL_KEYS]
    if unknown:
        raise InvalidInput(f"unknown top-level key {unknown[0]!r}; allowed: {', '.join(TOP_LEVEL_KEYS)}",
                           loc=("body", unknown[0]))
    batch_id = doc.get("batch_id")
    if batch_id is not None and (not isinstance(batch_id, str) or not 0 < len(batch_id) <= 128):
        raise InvalidInput("batch_id must be a string of 1 to 128 characters", loc=("body", "batch_id"))
    if ("records" in doc) == ("columns" in doc):
        raise InvalidInput("give exactly one of 'records' (rows) or 'columns'", loc=("body",),
                           hint='{"records": [{"step": 1, "rank": 0, "loss": 2.3}]}')
    if "records" in doc:
        columns, n = _rows_to_columns(doc["records"])
        where = _Where(("body", "records"), rows=True)
    else:
        columns, n = _check_columns(doc["columns"])
        where = _Where(("body", "columns"), rows=False)
    if len(columns) > max_names + len(KEY_FIELDS):
        _check_name_count(columns, max_names, where)
    batch = _build_batch(columns, n, where)
    _check_ranks(batch, max_ranks, where)
    return batch, body_digest(body, doc)


def _numeric_columns(body: bytes, max_names: int) -> tuple[dict[str, Any], int, str | None] | None:
    """``(columns, n, batch_id)`` of a columns push whose every column simdjson reads as it is:
    ``step`` and ``rank`` as int64, a metric as float64 (numbers only), a string or label column
    (and an integer field, whose check reads the numbers as sent) as a list. None for anything
    else, which the general path then accepts or rejects as it always did: a body that is not
    plain JSON (NaN tokens), other top-level keys, a ``batch_id`` that is not a string, a repeated
    key, a column that is not a list or holds a null, a boolean, a string or a nested list, or
    columns of unequal lengths."""
    # The key is looked for near the start only (after a batch_id at most): a rows body of 200 KB
    # is not searched through, and a body with its columns last takes the general path.
    if len(body) < FAST_COLUMNS_MIN_BYTES or body.find(b'"columns"', 0, 256) < 0:
        return None   # a small push (its fixed cost would not pay), or rows
    try:
        # A parser per body: as cheap as reusing one, and nothing shared between threads.
        doc = simdjson.Parser().parse(body)
        if not isinstance(doc, simdjson.Object):
            return None
        keys = list(doc.keys())
        if set(keys) - {"columns", "batch_id"} or len(keys) != len(set(keys)) or "columns" not in doc:
            return None
        batch_id = doc.get("batch_id")
        if batch_id is not None and (type(batch_id) is not str or not 0 < len(batch_id) <= 128):
            return None
        cols = doc["columns"]
        if not isinstance(cols, simdjson.Object):
            return None
        names = list(cols.keys())
        if len(names) != len(set(names)) or len(names) > max_names + len(KEY_FIELDS):
            return None
        arrays = {name: col for name in names if isinstance(col := cols[name], simdjson.Array)}
        if len(arrays) != len(names):
            return None
        # as_buffer flattens nested lists ([[1], 2] reads as [1, 2]): one '[' a column, no more
        # (counted by numpy: bytes.count of one byte was a fifth of this decode).
        if np.count_nonzero(np.frombuffer(body, np.uint8) == ord("[")) != len(names):
            return None
        out: dict[str, Any] = {}
        n = -1
        for name, col in arrays.items():
            if name in KEY_FIELDS:
                out[name] = np.frombuffer(col.as_buffer(of_type="i"), np.int64)
            elif name in STRING_FIELDS or name in LABEL_FIELDS or name in INTEGER_FIELDS:
                out[name] = col.as_list()
            else:
                out[name] = np.frombuffer(col.as_buffer(of_type="d"), np.float64)
            if n < 0:
                n = len(out[name])
            elif len(out[name]) != n:
                return None
        return out, max(n, 0), batch_id
    except Exception:   # noqa: BLE001 - simdjson's errors (not plain JSON, not such a column): the general path judges
        return None


def _check_ranks(batch: MetricBatch, max_ranks: int, where: "_Where") -> None:
    if len(batch) and int(batch.ranks.max()) >= max_ranks:
        i = int(np.argmax(batch.ranks >= max_ranks))
        raise InvalidInput(f"rank {int(batch.ranks[i])} is beyond this service's limit (ranks below "
                           f"max_ranks = {max_ranks})", loc=where("rank", i),
                           hint="raise HEALTHSVC_MAX_RANKS if the job really is that large")
    if "world_size" in batch.values:
        ws, ok = batch.values["world_size"], batch.present["world_size"]
        bad = ok & ~((ws >= 1) & (ws <= max_ranks) & (ws == np.floor(ws)))
        if bad.any():
            i = int(np.argmax(bad))
            raise InvalidInput(f"world_size must be an integer from 1 to max_ranks = {max_ranks}, got {float(ws[i])!r}",
                               loc=where("world_size", i))


def _check_name_count(columns: dict, max_names: int, where: "_Where") -> None:
    names = [k for k in columns if k not in KEY_FIELDS and k not in STRING_FIELDS]
    if len(names) > max_names:
        raise InvalidInput(f"the batch has {len(names)} distinct field names; a run may have at most {max_names} "
                           f"(setting max_metric_names)", loc=where(names[max_names]),
                           hint="raise HEALTHSVC_MAX_METRIC_NAMES if this is expected; or send such values as fewer metrics")


class _Where:
    """Builds an error's ``loc``: rows name (records, i, field), columns (columns, field, i)."""

    def __init__(self, prefix: tuple, rows: bool) -> None:
        self.prefix, self.rows = prefix, rows

    def __call__(self, name: str, index: int | None = None) -> tuple:
        if index is None:
            return (*self.prefix, name)
        return (*self.prefix, index, name) if self.rows else (*self.prefix, name, index)


def _rows_to_columns(records: Any) -> tuple[dict[str, list], int]:
    if not isinstance(records, list):
        raise InvalidInput("'records' must be a list of objects", loc=("body", "records"))
    if records and type(records[0]) is dict:
        keys = list(records[0])
        # Fast path: every record has the first record's keys (the usual case). itemgetter and
        # zip transpose rows into columns in C; any odd record sends us to the general path.
        if keys and all(type(rec) is dict and len(rec) == len(keys) for rec in records):
            try:
                rows = list(map(itemgetter(*keys), records))
            except KeyError:
                pass
            else:
                if len(keys) == 1:
                    return {keys[0]: rows}, len(records)
                return dict(zip(keys, zip(*rows))), len(records)
    for i, rec in enumerate(records):
        if type(rec) is not dict:
            raise InvalidInput("each record must be an object", loc=("body", "records", i))
    all_keys: set[str] = set()
    for rec in records:
        all_keys.update(rec)
    # One list per field; a key absent from a record becomes None = "not reported".
    return {k: [rec.get(k) for rec in records] for k in all_keys}, len(records)


def _check_columns(columns: Any) -> tuple[dict[str, list], int]:
    if not isinstance(columns, dict):
        raise InvalidInput("'columns' must be an object of equal-length lists", loc=("body", "columns"))
    n = None
    for name, col in columns.items():
        if not isinstance(col, list):
            raise InvalidInput(f"column {name!r} must be a list", loc=("body", "columns", name))
        if n is None:
            n = len(col)
        elif len(col) != n:
            raise InvalidInput(f"column {name!r} has {len(col)} values, other columns have {n}",
                               loc=("body", "columns", name), hint="all columns must have equal length")
    return columns, n or 0


def _build_batch(columns: dict[str, list], n: int, where: _Where) -> MetricBatch:
    for key in KEY_FIELDS:
        if key not in columns:
            raise InvalidInput(f"field {key!r} is required", loc=where(key))
    steps = _int_column("step", columns["step"], where)
    ranks = _int_column("rank", columns["rank"], where)
    batch = MetricBatch(steps=steps, ranks=ranks)
    partial = []   # fields some record did not report (the batch's partial_fields, known here)
    for name, col in columns.items():
        if name in KEY_FIELDS:
            continue
        if name not in _VALID_NAMES and not _valid_name(name):
            raise InvalidInput(f"field name {name!r} is reserved or not a valid name "
                               "(letters, digits, '_' and '.', up to 64 characters)", loc=where(name))
        if name in LABEL_FIELDS:
            batch.labels[name] = _string_column(name, col, where, max_chars=128, min_chars=1)
        elif name in STRING_FIELDS:
            batch.host_names, batch.host_index = _string_column(name, col, where)
        else:
            batch.values[name], batch.present[name], complete = _float_column(name, col, where)
            if not complete:
                partial.append(name)
            if name in INTEGER_FIELDS:
                _check_integers(name, col, batch.values[name], batch.present[name], where)
    if n > 1:
        _check_unique_keys(steps, ranks, where)
    batch.partial_fields = frozenset(partial)
    return batch


# Field names seen valid (pushes repeat the same few): checked by a set lookup, not the pattern.
_VALID_NAMES: set[str] = set()


def _valid_name(name: str) -> bool:
    if name in RESERVED_FIELDS or not FIELD_NAME.match(name):
        return False
    if len(_VALID_NAMES) < 4096:
        _VALID_NAMES.add(name)
    return True


def _int_column(name: str, col: list | np.ndarray, where: _Where) -> np.ndarray:
    if isinstance(col, np.ndarray):   # read as int64 already (_numeric_columns)
        if col.size and col.min() < 0:
            i = int(np.argmax(col < 0))
            raise InvalidInput(f"{name} must be an integer >= 0, got {int(col[i])}", loc=where(name, i))
        return col
    if len(col) == 1 and type(col[0]) is int and 0 <= col[0] <= _INT64_MAX:   # a rank's own push
        return np.array(col, np.int64)
    arr = _try_array(col)
    # numpy turns [1, true] into [1, 1]: a boolean is not an integer.
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu" and not _holds_bool(col, arr):
        if arr.size and arr.min() < 0:
            i = int(np.argmax(arr < 0))
            raise InvalidInput(f"{name} must be an integer >= 0, got {int(arr[i])}", loc=where(name, i))
        if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
            i = int(np.argmax(arr > np.iinfo(np.int64).max))
            raise InvalidInput(f"{name} is too large", loc=where(name, i))
        return arr.astype(np.int64, copy=False)
    if len(col) == 0:
        return np.zeros(0, dtype=np.int64)
    for i, x in enumerate(col):
        if type(x) is not int:
            raise InvalidInput(f"{name} must be an integer >= 0, got {_describe(x)}", loc=where(name, i))
        if x < 0:
            raise InvalidInput(f"{name} must be an integer >= 0, got {x}", loc=where(name, i))
        if x > np.iinfo(np.int64).max:
            raise InvalidInput(f"{name} is too large", loc=where(name, i))
    raise InvalidInput(f"{name} must be a list of integers", loc=where(name))  # pragma: no cover


def _holds_bool(col: list, arr: np.ndarray) -> bool:
    """Whether ``col``, which numpy read as the integer array ``arr``, holds a boolean. numpy
    reads true and false as 1 and 0, so only the elements read as 0 or 1 can be one: their types
    are checked (a push's steps and ranks hold few; a pass over every element's type was most of
    what this module added to a push's parse since 91dd201, timed in process)."""
    if len(col) <= 64:   # a short column: one pass over its types costs less than numpy's calls
        return bool in set(map(type, col))
    small = np.flatnonzero(arr <= 1)
    if len(small) > 64:   # many zeros and ones: one C-speed pass over the types instead
        return bool in set(map(type, col))
    return any(type(col[i]) is bool for i in small.tolist())


def _float_column(name: str, col: list | np.ndarray, where: _Where) -> tuple[np.ndarray, np.ndarray, bool]:
    """(values, present, whether every record reported the field)."""
    if isinstance(col, np.ndarray):   # read as float64 already (_numeric_columns)
        return col, all_present(len(col)), True
    if len(col) == 1 and type(col[0]) is float:   # a rank's own push
        return np.array(col, np.float64), all_present(1), True
    arr = _try_array(col)
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "fiu":
        return arr.astype(np.float64, copy=False), all_present(len(col)), True
    # Slow path: nulls, non-finite strings, or something wrong to point at.
    values = np.empty(len(col), dtype=np.float64)
    present = np.ones(len(col), dtype=bool)
    complete = True
    for i, x in enumerate(col):
        t = type(x)
        if t is float or t is int:
            try:
                values[i] = x
            except OverflowError:
                raise InvalidInput(f"{name} value is out of the float64 range", loc=where(name, i)) from None
        elif x is None:
            values[i] = np.nan
            present[i] = False
            complete = False
        elif t is str and x in NON_FINITE_STRINGS:
            values[i] = NON_FINITE_STRINGS[x]
        else:
            raise InvalidInput(
                f"{name} must be a number, null, or one of \"NaN\", \"Infinity\", \"-Infinity\"; got {_describe(x)}",
                loc=where(name, i))
    return values, present, complete


_MAX_EXACT = 2 ** 53
_MAX_EXACT_INT = float(_MAX_EXACT)
_INT64_MAX = int(np.iinfo(np.int64).max)


def _check_integers(name: str, col: list, values: np.ndarray, present: np.ndarray, where: _Where) -> None:
    """An integer field (``INTEGER_FIELDS``): a reported value must be a whole number from 0 to
    2**53; NaN/Infinity are no integers. The JSON parsers read integers exactly, but float64
    rounds 2**53 + 1 down to 2**53: values that reach 2**53 after the conversion are checked
    against the integers as sent (rare, so the usual push pays one vectorised comparison)."""
    with np.errstate(invalid="ignore"):
        bad = present & ~((values >= 0) & (values <= _MAX_EXACT_INT) & (values == np.floor(values)))
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidInput(f"{name} must be an integer from 0 to 2**53, got {float(values[i])!r}",
                           loc=where(name, i))
    at_limit = present & (values == _MAX_EXACT_INT)
    if at_limit.any():
        for i in np.flatnonzero(at_limit).tolist():
            if type(col[i]) is int and col[i] > _MAX_EXACT:
                raise InvalidInput(f"{name} must be an integer from 0 to 2**53, got {col[i]} (above 2**53, "
                                   "where float64 would round it)", loc=where(name, i))


def _string_column(name: str, col: list, where: _Where, max_chars: int = 255,
                   min_chars: int = 0) -> tuple[list[str], np.ndarray]:
    names: dict[str, int] = {}
    index = np.full(len(col), -1, dtype=np.int32)
    for i, x in enumerate(col):
        if x is None:
            continue
        if type(x) is not str or not min_chars <= len(x) <= max_chars:
            size = f"{min_chars} to {max_chars}" if min_chars else f"at most {max_chars}"
            raise InvalidInput(f"{name} must be a string of {size} characters, got {_describe(x)}",
                               loc=where(name, i))
        index[i] = names.setdefault(x, len(names))
    return list(names), index


def _check_unique_keys(steps: np.ndarray, ranks: np.ndarray, where: _Where) -> None:
    if len(steps) <= 32:   # a rank's or a host's few records: a set of pairs, no numpy calls
        if len(set(zip(steps.tolist(), ranks.tolist()))) == len(steps):
            return
    # The usual push comes in (step, rank) order: pairs that strictly increase are distinct, seen
    # in one pass without the sort (which was a third of a 1,024-record push's column building).
    later = steps[1:] > steps[:-1]
    if (later | ((steps[1:] == steps[:-1]) & (ranks[1:] > ranks[:-1]))).all():
        return
    order = np.lexsort((ranks, steps))
    s, r = steps[order], ranks[order]
    same = (s[1:] == s[:-1]) & (r[1:] == r[:-1])
    if same.any():
        dup = int(order[1:][same][0])
        raise InvalidInput(f"(step, rank) = ({int(steps[dup])}, {int(ranks[dup])}) appears twice in the batch",
                           loc=where("step", dup), hint="send each rank's step once per request")


def _try_array(col: list) -> np.ndarray | None:
    try:
        arr = np.array(col)
    except (ValueError, TypeError, OverflowError):
        return None
    return arr


def _describe(x: Any) -> str:
    text = json.dumps(x, allow_nan=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."
