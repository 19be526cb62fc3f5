"""Trainer-side client for healthsvc, wandb-style. Standard library only: importing it pulls in no
FastAPI, pandas, numpy or torch.

The three lines for a training loop::

    import healthsvc_client as health
    run = health.init("http://healthsvc:8000", run_id="exp-42", rank=dist.get_rank())
    ...
        health.log(loss=loss.item(), grad_norm=gn, step=step)      # in the loop
    ...
    health.finish()

``init`` reads defaults from the environment when arguments are omitted: ``HEALTHSVC_URL``,
``HEALTHSVC_RUN_ID``, ``HEALTHSVC_MODE`` (online/offline/disabled), ``HEALTHSVC_SPOOL``,
``HEALTHSVC_RELAY`` (the host's relay socket, see ``healthsvc_client.relay``), and
torchrun's ``RANK`` and ``WORLD_SIZE``. The module-level functions act on the run made by the last
``init`` and do nothing (one warning) before it. See ``healthsvc_client.client.Run`` for the whole API and
``docs/client.md`` for what happens when the service is down.
"""
# The package loads nothing until one of the names below is used: the service imports
# ``healthsvc_client.wire`` (the wire vocabulary) and must not load the trainer client, which registers
# fork and exit handlers. ``health.init`` & co. come from ``healthsvc_client.api``, loaded on first use.
from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "init", "log", "log_columns", "fingerprint", "checkpoint", "event", "alert", "finish", "flush",
    "rollback_target", "phase", "set_phase", "stats", "current_run",
    "Run", "ClientStats", "StepTimer", "MODES",
    "Transport", "HTTPTransport", "MockTransport", "Request", "Response",
    "TransportError", "ConnectError", "RequestTimeout",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # Loading healthsvc_client.api sets every name of __all__ on this package (later lookups are
        # plain attribute reads: health.log is hot).
        return getattr(importlib.import_module(f"{__name__}.api"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
