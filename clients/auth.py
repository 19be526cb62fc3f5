"""The token the client and the CLI send: ``HEALTHSVC_TOKEN`` as ``Authorization: Bearer``.

Read at each request (a cheap environment lookup on the sender thread), so a token rotated in the
environment of a long job's launcher is picked up by processes started afterwards without code."""
from __future__ import annotations

import os


def auth_headers() -> dict[str, str]:
    token = os.environ.get("HEALTHSVC_TOKEN", "").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}
