"""The hang detector's memory: one row per rank, the deadlines derived from it, and what persists.

Every per-rank quantity is a column (``HangState._ARRAYS``: dtype and the fill of a new rank) over
the known ranks sorted by id, so the detector's input and its tick are a few array operations
whatever the world size. A rank never seen before grows every column at once (``_positions``).
The deadlines (when each rank becomes overdue) are derived from the columns and kept up to date
where they move; ``state_dict`` holds only what cannot be derived.
"""
from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

_NEVER = -1.0   # "no heartbeat yet" (times are the caller's clock, assumed >= 0)
_STEP_SAMPLES = 16   # step-duration samples kept for the median (one pause is one sample)


class HangState:
    """The per-rank table of :class:`~healthsvc_detectors.hang.detector.HangDetector`, its derived deadlines
    and its ``state_dict``; the timeouts read the detector's ``timeout_floor_s``,
    ``timeout_factor`` and ``startup_timeout_s``."""

    # Declared for the type checker: the detector's settings, and the columns of _ARRAYS
    # (set by name in _reset, load_state_dict and _positions).
    timeout_floor_s: float
    timeout_factor: float
    startup_timeout_s: float
    _ids: np.ndarray
    _last_step: np.ndarray
    _progress_s: np.ndarray
    _push_s: np.ndarray
    _interval_s: np.ndarray
    _hb_s: np.ndarray
    _hb_step: np.ndarray
    _hb_phase: np.ndarray
    _back_step: np.ndarray
    _active: np.ndarray
    _hung: np.ndarray

    _ARRAYS: dict[str, tuple[type, Any]] = {
        "ids": (np.int64, 0),
        "last_step": (np.int64, -1),        # last record step (-1: none yet)
        "progress_s": (np.float64, 0.0),    # when the rank last made progress
        "push_s": (np.float64, 0.0),        # when its last record with a new step arrived
        "interval_s": (np.float64, 0.0),    # EWMA push interval (0: unknown)
        "hb_s": (np.float64, _NEVER),       # when its last heartbeat arrived
        "hb_step": (np.int64, -1),
        "hb_phase": (np.int64, -1),         # index into self._phases
        "back_step": (np.int64, -2),        # its step when it last came back from a pause (-2: never)
        "active": (np.bool_, True),         # expected: in the world, not departed
        "hung": (np.bool_, False),          # an open hang finding
    }

    def _reset(self) -> None:
        for name, (dtype, _) in self._ARRAYS.items():
            setattr(self, "_" + name, np.zeros(0, dtype=dtype))
        self._floor = np.zeros(0)    # timeout_floor_s per rank (a maximum against it is SIMD)
        self._phases: list[str] = []
        self._finished = False
        self._stalled = False
        self._held = False   # a pause excused silence (the job waited for a checkpoint)
        # The job's last progress when the open stall or hold began: the ranks whose deadline
        # had passed by then were hanging already, not waiting (see _going_quiet).
        self._quiet_s = 0.0
        # The job's front (highest record step) and when it last advanced; seconds per step of
        # the last advances (the typical step duration is their median).
        self._front_step = -1
        self._front_s = 0.0
        self._step_samples: deque[float] = deque(maxlen=_STEP_SAMPLES)
        # Derived, not state: when each rank becomes overdue (inf when not expected), and the
        # latest progress of any rank (the max of _progress_s, kept up to date where it moves).
        self._deadline_s = np.zeros(0)
        self._last_progress_s = 0.0
        self._all_active = False   # a cache: every known rank is expected

    def _refresh_deadlines(self, sel: slice | np.ndarray | int = slice(None)) -> None:
        timeout = self._timeouts(self._interval_s[sel])
        self._deadline_s[sel] = np.where(self._active[sel], self._progress_s[sel] + timeout, np.inf)

    def _timeouts(self, interval_s: np.ndarray | None = None) -> np.ndarray:
        interval_s = self._interval_s if interval_s is None else interval_s
        known = np.maximum(self.timeout_floor_s, self.timeout_factor * interval_s)
        startup = max(self.timeout_floor_s, self.startup_timeout_s)
        return np.where(interval_s > 0, known, startup)

    def state_dict(self) -> dict[str, Any]:
        state = {name: getattr(self, "_" + name).tolist() for name in self._ARRAYS}
        state.update(phases=list(self._phases), finished=self._finished, stalled=self._stalled,
                     held=self._held, quiet_s=self._quiet_s,
                     front_step=self._front_step, front_s=self._front_s,
                     step_samples=list(self._step_samples))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        n = len(state["ids"])
        for name, (dtype, fill) in self._ARRAYS.items():
            # A column newer than the snapshot (back_step) starts at its fill for every rank.
            setattr(self, "_" + name, np.asarray(state[name], dtype=dtype) if name in state
                    else np.full(n, fill, dtype=dtype))
        self._phases = list(state["phases"])
        self._finished, self._stalled = bool(state["finished"]), bool(state["stalled"])
        # Snapshots from before the collective-wait path lack these: start without samples.
        self._held = bool(state.get("held", False))
        self._front_step = int(state.get("front_step", -1))
        self._front_s = float(state.get("front_s", 0.0))
        self._step_samples = deque((float(x) for x in state.get("step_samples", [])),
                                   maxlen=_STEP_SAMPLES)
        self._deadline_s = np.zeros(len(self._ids))
        self._last_progress_s = float(self._progress_s.max()) if len(self._ids) else 0.0
        # Older snapshots lack it: the latest progress stands for it (no rank progressed since
        # a stall or hold began).
        self._quiet_s = float(state.get("quiet_s", self._last_progress_s))
        self._refresh_deadlines()

    def _going_quiet(self) -> None:
        """A stall is found or a pause holds the job: when this begins a quiet spell, remember the
        job's last progress (of the expected ranks, as ``tick`` judges a hang against)."""
        if not (self._stalled or self._held):
            act = self._active
            self._quiet_s = float(self._progress_s[act].max()) if act.any() else self._last_progress_s

    def _positions(self, ids: np.ndarray, now: float) -> np.ndarray | None:
        """Table positions of ``ids`` (sorted, unique), adding new ranks; None = the whole table."""
        if len(ids) == len(self._ids) and (ids is self._ids or bool((ids == self._ids).all())):
            return None
        # Both sorted: a binary search finds the known ranks (np.isin's set machinery cost half
        # of a one-rank push's observe); a position past the end or at another id is a new rank.
        pos = np.searchsorted(self._ids, ids)
        n = len(self._ids)
        if not len(ids) or (n and int(pos[-1]) < n and bool((self._ids[pos] == ids).all())):
            return pos
        merged = np.union1d(self._ids, ids)
        old = np.searchsorted(merged, self._ids)
        for name, (dtype, fill) in self._ARRAYS.items():
            arr: np.ndarray = np.full(len(merged), fill, dtype=dtype)
            arr[old] = getattr(self, "_" + name)
            setattr(self, "_" + name, arr)
        self._ids = merged
        self._all_active = False
        new = np.ones(len(merged), dtype=bool)
        new[old] = False
        self._progress_s[new] = now   # a new rank's silence starts when it is first known
        self._last_progress_s = max(self._last_progress_s, now)
        self._deadline_s = np.zeros(len(merged))
        self._refresh_deadlines()
        return np.searchsorted(self._ids, ids)
