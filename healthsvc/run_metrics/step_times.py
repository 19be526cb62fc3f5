"""The run's median step time for ``healthsvc_run_step_time_median_seconds``: a window of the
newest finite ``step_time`` values, all ranks together."""
from __future__ import annotations

import threading
from typing import Any, Iterable

import numpy as np


STEP_TIME_WINDOW = 512  # step_time values kept per run for the median (all ranks, newest last)
COMPACT_AT_PARTS = 256  # pushes held before they are cut to the window (objects the GC tracks)
# ... or records held: 8,192 (under 80 KB a run). A cut costs about the same whatever it holds
# (newest first, it stops once the window is full): at four windows' worth a run of 1,024-record
# pushes was cut every other push (bench/run_series.py: 7.8 us a push, now 2.6).
COMPACT_AT_RECORDS = 16 * STEP_TIME_WINDOW


class StepTimes:
    """The newest ``STEP_TIME_WINDOW`` finite ``step_time`` values of each run (writer thread in,
    scrape thread out). A push only hands its column over (the writer thread does that for every
    push); the values are filtered and cut to the window when a scrape asks, or when a run holds
    ``COMPACT_AT_RECORDS`` records or ``COMPACT_AT_PARTS`` pushes."""

    def __init__(self, window: int = STEP_TIME_WINDOW) -> None:
        self.window = window
        self._parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}   # (values, present), oldest first
        self._held: dict[str, int] = {}      # records in a run's parts
        self._lock = threading.Lock()

    def add(self, pushes: list[tuple[Any, Any]]) -> None:
        """A group commit's new (result, batch) pairs (``feed.new_batches``)."""
        with self._lock:
            for r, batch in pushes:
                if "step_time" not in batch.values:
                    continue
                parts = self._parts.get(r.run_id)
                if parts is None:
                    parts = self._parts[r.run_id] = []
                parts.append((batch.values["step_time"], batch.present["step_time"]))
                held = self._held[r.run_id] = self._held.get(r.run_id, 0) + len(batch)
                if held > max(COMPACT_AT_RECORDS, 4 * self.window) or len(parts) > COMPACT_AT_PARTS:
                    self._compact(r.run_id)

    def _compact(self, run_id: str) -> np.ndarray:
        """The run's window as one array (the lock held). Newest push first, and no further back
        than the window's worth of finite values: at 1,024 records a push the newest push alone
        fills it, and the older ones held are dropped unread."""
        kept: list[np.ndarray] = []
        n = 0
        for values, present in reversed(self._parts[run_id]):
            v = values[present]
            v = v[np.isfinite(v)]
            kept.append(v)
            n += len(v)
            if n >= self.window:
                break
        v = np.concatenate(kept[::-1])[-self.window:] if kept else np.zeros(0)
        self._parts[run_id], self._held[run_id] = [(v, np.ones(len(v), bool))], len(v)
        return v

    def median(self, run_id: str) -> float | None:
        with self._lock:
            if run_id not in self._parts:
                return None
            v = self._compact(run_id)
        return float(np.median(v)) if v.size else None

    def forget(self, run_ids: Iterable[str]) -> None:
        """Let go of runs the store let go of (finished and quiet)."""
        with self._lock:
            for run_id in run_ids:
                self._parts.pop(run_id, None)
                self._held.pop(run_id, None)

    def keep_only(self, run_ids: set[str]) -> None:
        """Forget runs that are no longer exported (bounded memory)."""
        with self._lock:
            for run_id in set(self._parts) - run_ids:
                del self._parts[run_id], self._held[run_id]
