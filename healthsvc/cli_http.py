"""The HTTP call behind the client commands of the CLI (``runs``, ``status``, ``rollback``,
``bisect``, ``alerts``, ``ack``, ``silence``, ``findings``): standard library only, so they work after ``pip install .`` without extras, on a
training node.

The service is found with ``--url`` or ``HEALTHSVC_URL`` (default http://127.0.0.1:8080); when
``HEALTHSVC_TOKEN`` is set every request carries ``Authorization: Bearer <token>``.

Exit statuses shared by the client commands: 0 success, 1 the service refused (the message says
why, e.g. a 404 for an unknown run), 2 the service could not be reached or answered garbage,
3 the answer is "nothing to do" where a script must not go on (``rollback`` with no checkpoint).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
OK, REFUSED, UNREACHABLE, NOTHING = 0, 1, 2, 3


def add_url_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("HEALTHSVC_URL", DEFAULT_URL),
                   help="service base URL (env HEALTHSVC_URL; default %(default)s)")


def auth_headers() -> dict[str, str]:
    """``Authorization: Bearer $HEALTHSVC_TOKEN`` when the variable is set, else nothing."""
    token = os.environ.get("HEALTHSVC_TOKEN", "").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def _error_message(raw: bytes) -> str:
    try:
        detail = json.loads(raw).get("detail")
    except (ValueError, AttributeError):
        return raw.decode(errors="replace")[:300]
    if isinstance(detail, list):
        return "; ".join(_field(d) + str(d.get("msg", "")) + (f" ({d['hint']})" if d.get("hint") else "")
                         for d in detail if isinstance(d, dict))
    return str(detail)


def _field(d: dict) -> str:
    """``"kind: "`` for an error about the ``kind`` query parameter (where the request was wrong:
    ``loc`` without its leading ``query``/``body``/``path``), or nothing.

    >>> _field({"loc": ["query", "kind"]}), _field({"loc": ["body"]}), _field({})
    ('kind: ', '', '')
    """
    loc = [str(p) for p in d.get("loc") or ()]
    where = ".".join(loc[1:] if loc and loc[0] in ("query", "body", "path", "header") else loc)
    return f"{where}: " if where else ""


def call(method: str, url: str, path: str, body: dict | None = None,
         timeout_s: float = 60.0) -> tuple[Any, int]:
    """``(answer, OK)`` or ``(None, REFUSED | UNREACHABLE)`` after printing why on stderr."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json", **auth_headers()}
    if data is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        print(f"healthsvc: {exc.code}: {_error_message(exc.read())}", file=sys.stderr)
        return None, REFUSED
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"healthsvc: cannot reach {url}: {reason}", file=sys.stderr)
        return None, UNREACHABLE
    try:
        return (json.loads(raw) if raw else {}), OK
    except ValueError:
        print(f"healthsvc: {url} did not answer JSON: {raw[:200]!r}", file=sys.stderr)
        return None, UNREACHABLE


def get_to_show(args: Any, path: str) -> tuple[Any, int | None]:
    """``GET path`` for a listing command: ``(answer, None)`` for the caller to render as text,
    or ``(None, exit status)`` when the command is done: the request failed (said on stderr),
    or ``args.json`` asked for the answer, which is printed as it is."""
    answer, rc = call("GET", args.url, path)
    if rc != OK:
        return None, rc
    if args.json:
        print(json.dumps(answer, indent=2))
        return None, OK
    return answer, None


def table(rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart (the last is not padded)."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join([c.ljust(w) for c, w in zip(r[:-1], widths)] + [r[-1]]) for r in rows)


def fields(pairs: list[tuple[str, Any]]) -> str:
    """``key:  value`` lines, values aligned (as ``gh run view``); None values are left out."""
    shown = [(k, str(v)) for k, v in pairs if v is not None]
    width = max((len(k) for k, _ in shown), default=0) + 1
    return "\n".join(f"{(k + ':').ljust(width)}  {v}" for k, v in shown)
