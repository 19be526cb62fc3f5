"""Which scope each request needs: a pure function of method and path.

- ``ingest``: what trainers send: ``POST /v1/runs/{run}/metrics|checkpoints|heartbeats|events|finish``
  and a replay probe's reports (``POST /v1/runs/{run}/probes/{id}/reports``) (a token may be
  limited to run ids starting with a prefix);
- ``read``: every ``GET``/``HEAD`` (runs, findings, history, alerts, webhooks without secrets);
- ``admin``: every other change: run config (``PUT /v1/runs/{run}``), checkpoint status,
  webhooks, silences, acknowledgements, bisections, tokens; and reading the audit log and tokens.

``admin`` includes the other two. Public (no token): ``/healthz``, ``/readyz``, the API docs.

    >>> required_scope("POST", "/v1/runs/exp-1/metrics")
    ('ingest', 'exp-1')
    >>> required_scope("POST", "/v1/runs/exp-1/probes/3/reports")
    ('ingest', 'exp-1')
    >>> required_scope("PUT", "/v1/runs/exp-1")
    ('admin', 'exp-1')
    >>> required_scope("GET", "/v1/tokens")
    ('admin', None)
    >>> required_scope("GET", "/healthz")
    (None, None)
"""
from __future__ import annotations

import re
from functools import lru_cache

SCOPES: tuple[str, ...] = ("ingest", "read", "admin")
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
_INGEST = re.compile(r"^/v1/runs/([^/]+)/(metrics|checkpoints|heartbeats|events|finish|probes/[0-9]+/reports)$")
_RUN = re.compile(r"^/v1/runs/([^/]+)")
_ADMIN_READS = ("/v1/tokens", "/v1/audit")


@lru_cache(maxsize=4096)   # asked for every request; a trainer's pushes repeat one path
def required_scope(method: str, path: str) -> tuple[str | None, str | None]:
    """(scope needed or None for public, the run id the path names or None)."""
    if path in PUBLIC_PATHS:
        return None, None
    run = _RUN.match(path)
    run_id = run.group(1) if run else None
    if method in ("GET", "HEAD"):
        if path.startswith(_ADMIN_READS):
            return "admin", run_id
        return "read", run_id
    if method == "POST" and _INGEST.match(path):
        return "ingest", run_id
    return "admin", run_id


def grants(token_scopes: frozenset[str], needed: str) -> bool:
    return needed in token_scopes or "admin" in token_scopes
