"""The process's live runs, and what happens to them at fork and at exit.

Fork: a child process (a data-loader worker) inherits a disabled copy of every run: its calls are
ignored and it never touches the parent's threads, locks, sockets or spool file. Exit: each run
still open is flushed within its ``exit_flush_timeout_s`` (no ``finish``: an exit may be a crash).
The handlers are registered once, when this module is first imported (by ``healthsvc_client.client``).
"""
from __future__ import annotations

import atexit
import os
import weakref
from typing import Any

live_runs: weakref.WeakSet[Any] = weakref.WeakSet()


def track(run: Any) -> None:
    """Register ``run`` (a ``healthsvc_client.client.Run``) for the fork and exit handlers."""
    live_runs.add(run)


def _after_fork_in_child() -> None:
    for run in list(live_runs):
        run._disable_in_forked_child()


def _flush_all_at_exit() -> None:
    for run in list(live_runs):
        try:
            run._flush_at_exit()
        except Exception:  # never turn a clean exit into a traceback
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_flush_all_at_exit)
