"""The service's drain barrier: return once everything already caused has been processed.

The stages and their order are :mod:`healthsvc.pipeline`'s (its ``build`` lists them);
:func:`drain` is the pipeline's :meth:`~healthsvc.pipeline.Pipeline.drain`: each stage in turn,
the store's writer after each, so when it returns every finding, alert, notification and webhook
attempt caused by what came before the call is stored (webhook retries scheduled for later
excepted: they fall due when the clock gets there).

With ``tick=True`` the time-driven checks (hang and stall timeouts, aligner waits, alert group
intervals and resolve timeouts) also run once at the clock's time now: a test that drives the
service with a fake clock advances it, then drains with ``tick=True``, instead of sleeping.

Whoever waits for the whole service (``tests/harness.py``, tools) calls this function, not the
stages' own barriers, which only a test of that one stage uses.
"""
from __future__ import annotations

from typing import Any

from healthsvc.pipeline import DrainTimeout

__all__ = ["DrainTimeout", "drain"]


def drain(app: Any, *, tick: bool = False, timeout_s: float = 30.0) -> None:
    """Block until the service behind ``app`` (a FastAPI app from ``create_app``) is idle."""
    app.state.pipeline.drain(tick=tick, timeout_s=timeout_s)
