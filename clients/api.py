"""The module-level run API behind ``import healthsvc_client as health``: ``init`` makes a
:class:`~healthsvc_client.client.Run` current and the other functions act on it (they do nothing, with one
warning, before ``init``). Loaded by ``clients/__init__.py`` on first use of one of its names.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

# Names imported here and not used are re-exported: clients.__all__ lists them (``health.StepTimer``).
from healthsvc_client.client import MODES, Run  # noqa: F401
from healthsvc_client.stats import ClientStats
from healthsvc_client.timing import StepTimer  # noqa: F401
from healthsvc_client.transport import (  # noqa: F401
    ConnectError,
    HTTPTransport,
    MockTransport,
    Request,
    RequestTimeout,
    Response,
    Transport,
    TransportError,
)

from healthsvc_client import __all__ as _package_names   # the package lists the public names, once

__all__ = list(_package_names)

_current: Run | None = None
_warned_no_run = False


def init(url: str | None = None, run_id: str | None = None, rank: int | None = None,
         host: str | None = None, world_size: int | None = None, **options: Any) -> Run:
    """Start reporting for this rank and make the run current. Options: see ``healthsvc_client.client.Run``.

    Raises ValueError (with how to fix the call) for missing or invalid arguments: a
    misconfigured job fails at start-up, never in the middle of training.
    """
    global _current
    env = os.environ
    url = url or env.get("HEALTHSVC_URL")
    run_id = run_id or env.get("HEALTHSVC_RUN_ID")
    if rank is None:
        rank = int(env.get("RANK", "0"))
    if world_size is None and "WORLD_SIZE" in env:
        world_size = int(env["WORLD_SIZE"])
    options.setdefault("mode", env.get("HEALTHSVC_MODE", "online"))
    if "HEALTHSVC_SPOOL" in env:
        options.setdefault("spool_path", env["HEALTHSVC_SPOOL"])
    if env.get("HEALTHSVC_RELAY"):
        options.setdefault("relay", env["HEALTHSVC_RELAY"])
    if not run_id:
        raise ValueError("init() needs run_id=... (or HEALTHSVC_RUN_ID), shared by all ranks")
    _current = Run(url, run_id, rank, host=host, world_size=world_size, **options)
    return _current


def current_run() -> Run | None:
    """The run made by the last ``init()``, or None."""
    return _current


def _run() -> Run | None:
    global _warned_no_run
    if _current is None and not _warned_no_run:
        _warned_no_run = True
        logging.getLogger("healthsvc.client").warning("healthsvc: call init() before log(); "
                                                      "calls are ignored until then")
    return _current


def log(metrics: Mapping[str, Any] | None = None, /, *, step: int | None = None, **fields: Any) -> None:
    """``log({"loss": 2.3}, step=10)`` or ``log(loss=2.3, step=10)``; see ``Run.log``."""
    run = _current  # read directly: this is the one facade call on the hot path
    if run is not None:
        run.log(metrics, step=step, **fields)
    else:
        _run()


def log_columns(columns: Mapping[str, Any], *, step: int | None = None) -> None:
    """Aggregator mode: one block for many ranks; see ``Run.log_columns``."""
    run = _run()
    if run is not None:
        run.log_columns(columns, step=step)


def fingerprint(model_or_params: Any, step: int | None = None, *, optimizer: Any = None,
                replica_group: int | None = None) -> str | None:
    """Log this rank's replica fingerprint (``param_digest``) for ``step``; see ``Run.fingerprint``
    and ``healthsvc_client.digest``. Call it every ``healthsvc_client.digest.FINGERPRINT_EVERY`` steps."""
    run = _run()
    if run is None:
        return None
    return run.fingerprint(model_or_params, step, optimizer=optimizer, replica_group=replica_group)


def checkpoint(step: int, uri: str, duration_s: float | None = None, bytes: int | None = None) -> None:  # noqa: A002
    run = _run()
    if run is not None:
        run.checkpoint(step, uri, duration_s=duration_s, bytes=bytes)


def event(kind: str, step: int | None = None, **data: Any) -> None:
    run = _run()
    if run is not None:
        run.event(kind, step=step, **data)


def alert(message: str, severity: str = "warning", step: int | None = None, **data: Any) -> None:
    run = _run()
    if run is not None:
        run.alert(message, severity=severity, step=step, **data)


def phase(name: str, step: int | None = None) -> contextlib.AbstractContextManager:
    run = _run()
    return run.phase(name, step=step) if run is not None else contextlib.nullcontext()


def set_phase(name: str, step: int | None = None) -> None:
    run = _run()
    if run is not None:
        run.set_phase(name, step=step)


def flush(timeout_s: float = 5.0) -> bool:
    run = _run()
    return run.flush(timeout_s) if run is not None else False


def finish(timeout_s: float = 10.0) -> bool:
    run = _run()
    return run.finish(timeout_s) if run is not None else False


def rollback_target(timeout_s: float | None = None) -> dict[str, Any] | None:
    run = _run()
    return run.rollback_target(timeout_s) if run is not None else None


def stats() -> ClientStats | None:
    run = _run()
    return run.stats() if run is not None else None


# The package's names are these, not the submodules some share a name with (``healthsvc_client.stats``,
# set on the package when ``healthsvc_client.stats`` is imported): put them on the package once loaded.
_package = sys.modules[__name__.rpartition(".")[0]]   # the package, whatever its import name
for _name in __all__:
    setattr(_package, _name, globals()[_name])
