"""Offline spool: request bodies appended to a JSON-lines file, uploaded later by ``healthsvc_client.sync``.

One line per request, exactly what would have been sent::

    {"method": "POST", "path": "/v1/runs/r1/metrics", "body": {"batch_id": "...", "records": [...]}}

NaN stays a ``NaN`` token (Python's json reads and writes it). Metrics bodies carry a ``batch_id``,
so uploading the same spool twice does not duplicate data on a server that deduplicates.

Example::

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "spool.jsonl")
    >>> with SpoolWriter(path) as spool:
    ...     spool.write("POST", "/v1/runs/r/finish", {"rank": 0})
    >>> list(read_spool(path))
    [('POST', '/v1/runs/r/finish', {'rank': 0})]
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any, TextIO


class SpoolWriter:
    """Appends one JSON line per request; flushed after every line so a crash loses at most one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._file: TextIO | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SpoolWriter({self.path!r})"

    def write(self, method: str, path: str, body: Any) -> None:
        line = json.dumps({"method": method, "path": path, "body": body}, allow_nan=True,
                          separators=(",", ":"))
        with self._lock:
            if self._file is None:
                # Opened lazily so a forked child that never writes never shares the parent's fd.
                self._file = open(self.path, "a", encoding="utf-8")
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_spool(path: str | os.PathLike[str], bad_lines: list[int] | None = None
               ) -> Iterator[tuple[str, str, Any]]:
    """Yield (method, path, body) per line.

    A line that does not parse (typically the last one, cut by a crash) is skipped and its 1-based
    number appended to ``bad_lines`` when given.
    """
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                item = (str(entry["method"]), str(entry["path"]), entry["body"])
            except (ValueError, KeyError, TypeError):
                if bad_lines is not None:
                    bad_lines.append(number)
                continue
            yield item
