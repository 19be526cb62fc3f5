"""The run's median step time for ``healthsvc_run_step_time_median_seconds``: a window of the
newest finite ``step_time`` values, all ranks together."""
from __future__ import annotations

import threading
from typing import Any, Iterable

import numpy as np

from healthsvc.run_metrics.feed import new_batches

STEP_TIME_WINDOW = 512  # step_time values kept per run for the median (all ranks, newest last)


class StepTimes:
    """The newest ``STEP_TIME_WINDOW`` finite ``step_time`` values of each run (writer thread in,
    scrape thread out). Each push's values go into its run's window as it is committed: at most
    ``STEP_TIME_WINDOW`` floats copied, and no push held (a held push kept every column of its
    batch alive until the next scrape; see ``ranks.py``)."""

    def __init__(self, window: int = STEP_TIME_WINDOW) -> None:
        self.window = window
        self._windows: dict[str, np.ndarray] = {}   # run -> its newest finite values, oldest first
        self._lock = threading.Lock()

    def on_store_results(self, results: list[Any]) -> None:
        for r, batch in new_batches(results):
            if "step_time" not in batch.values:
                continue
            v = batch.values["step_time"]
            v = v[batch.present["step_time"] & np.isfinite(v)][-self.window:]
            if not len(v):
                continue
            with self._lock:
                old = self._windows.get(r.run_id)
                keep = self.window - len(v)
                self._windows[r.run_id] = v.copy() if old is None or keep == 0 else \
                    np.concatenate([old[len(old) - min(keep, len(old)):], v])

    def median(self, run_id: str) -> float | None:
        with self._lock:
            v = self._windows.get(run_id)
        return float(np.median(v)) if v is not None and len(v) else None

    def forget(self, run_ids: Iterable[str]) -> None:
        """Let go of runs the store let go of (finished and quiet)."""
        with self._lock:
            for run_id in run_ids:
                self._windows.pop(run_id, None)

    def keep_only(self, run_ids: set[str]) -> None:
        """Forget runs that are no longer exported (bounded memory)."""
        with self._lock:
            for run_id in set(self._windows) - run_ids:
                del self._windows[run_id]
