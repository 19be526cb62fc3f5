"""The one barrier the tests wait on: poll a condition until it holds, or fail saying what."""
from __future__ import annotations

import time
import urllib.request
from typing import Any, Callable


def wait_until(predicate: Callable[[], Any], timeout_s: float = 15.0, what: str = "condition",
               interval_s: float = 0.1) -> Any:
    """The first truthy value of ``predicate()``; AssertionError after ``timeout_s`` (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def answers_ok(url: str, timeout_s: float = 1.0) -> bool:
    """True when ``url`` answers 200 now (a readiness probe, for ``wait_until``)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except OSError:
        return False
