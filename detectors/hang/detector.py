"""Hang and stall: silence, measured on the caller's clock.

This detector is driven by arrivals, not by step blocks, because silence is a matter of *when*
records arrive and blocks carry no arrival time. The caller (the service's run monitor) reports
every arrival with its own clock and drives ``tick(now)`` from a timer::

    det.set_world(ranks, now)                  # expected ranks (optional; arrivals add ranks too)
    det.observe(ranks, steps, now)             # per-rank step records arrived (arrays)
    det.heartbeat(rank, step, phase, now)      # a heartbeat arrived (phase: a plain string)
    det.tick(now)                              # -> new hang / stall findings
    det.finish(now)                            # the run finished: silence is normal from now on
    det.shift_clock(downtime_s)                # after a restart: downtime is not silence

This is the :class:`~healthsvc_detectors.base.AbsenceDetector` protocol: ``observe``, ``heartbeat``,
``set_world`` and ``finish`` return the *resolved* findings they cause; ``tick`` returns the new
*firing* ones. It has no ``update(block)``. The detector never reads a clock.

Definitions (times in seconds of the caller's clock):

- *progress* of a rank: a record whose step differs from its previous record's step (a restart
  that repeats steps is progress too), or a heartbeat whose step differs from its previous
  heartbeat's step. Heartbeats with an unchanged step prove the process is alive, not that it
  progresses: a rank whose heartbeats keep coming while its step stands still can hang.
- *push interval* of a rank: EWMA (``interval_alpha``) of the time between its record progress
  events, each sample capped at 4x the current estimate so one long pause does not inflate it.
- *timeout* of a rank: ``max(timeout_floor_s, timeout_factor * interval)``, or
  ``max(timeout_floor_s, startup_timeout_s)`` until its first interval is known (compilation and
  the first checkpoint load are slow).
- *overdue*: silent (no progress) for longer than its timeout.
- ``hang`` (critical, blames the rank): overdue while the job goes on without it (some rank made
  progress after this rank's deadline). In synchronous training a stuck rank stops everyone, so
  it shows as a stall instead, with the culprit named.
- ``stall`` (critical, run-wide, one finding): every expected rank is overdue. With heartbeats,
  the culprit is the rank outside the collective (fresh heartbeat with another phase, or no
  heartbeat for ``heartbeat_timeout_s`` while peers' heartbeats arrive) or behind the others'
  step while the rest wait inside ``collective_phase``; each culprit also gets a ``hang`` finding
  whose evidence says why.
- *Collective wait* (the fast path, long before the timeouts): no rank made progress for
  ``max(collective_wait_s, collective_wait_steps * typical step duration)`` and the heartbeats
  (every rank's latest sent after the last progress and no older than half the silence, nor
  than ``heartbeat_timeout_s``: each rank kept reporting through it) show the job split:
  peers inside ``collective_phase`` at one step S, and at most as many ranks outside it
  (another phase at a step <= S, or an unknown step) or behind S. Those are the culprits: a ``stall`` naming them
  and a ``hang`` for each, at once. A synchronous collective cannot finish without every rank,
  so the ranks outside it hold the others. It never fires when a rank is in one of
  ``pause_phases`` (a checkpoint: rank 0 saving while the others wait is normal), when peers
  do not tell their step, when a heartbeat is missing or stale, or when a rank outside the
  collective is ahead of S: then the timeouts decide. The *typical step duration* is the median
  of the last ``_STEP_SAMPLES`` samples of the job's front (highest record step): seconds
  between pushes that advanced it, per step advanced; no sample yet, no fast path.
- *Pause*: an expected rank whose fresh heartbeat says one of ``pause_phases`` and that has been
  silent for less than ``pause_timeout_s`` pauses: it is not overdue. The job *goes on* while
  some expected rank that does not pause pushed a record with a new step within its timeout (a
  rank first known, or a clock restarted at the end of a stall, is no sign of it). While it
  does not (a checkpoint that pauses every rank for minutes, or rank 0 saving while the others
  wait for it in a barrier), the pause *holds* the job: no rank is judged, no stall, no hang.
  While it goes on, nobody waits for the pausing ranks: only their own silence is excused, the
  others are judged as always, and a rank still "saving" once its silence reaches
  ``pause_timeout_s`` is judged like any rank: a ``hang`` at that tick (the job went on without
  it), its silence counted from its last progress. A heartbeat that stops ends the pause. A
  heartbeat that leaves the pause phases while the pause excuses the rank ends it too: the rank
  is back at work (its records come later) and counts its silence from that heartbeat; if the
  pause held the job, the job resumes with it. A rank comes back once per step: a heartbeat that
  leaves the pause again before the rank's step moved (its phase flapping between a pause and
  work while its step stands still) restarts nothing, or a rank stuck that way would never hang.
- *Resuming* (the first progress after a stall, or after a tick that a pause held, or a rank
  coming back from a pause that held the job): each expected rank that waited counts its
  silence from then on, so the moment between two ranks' records arriving is no hang. A rank
  did not wait, and keeps its silence, when its ``hang`` is open or its deadline had passed
  before the job went quiet (the latest progress of an expected rank when the stall was found
  or a pause first held a tick): the job went on without it, so it was hanging already (its hang
  held back by the pause, or no tick fell in between) and is found at the next tick, as without
  the pause. A pause that does not hold the job restarts no clock: the job did not wait.
- After ``finish(now)`` nothing fires; records arriving later re-open the run.
- A ``hang`` resolves when its rank progresses again, a ``stall`` when any rank does.

Scores: ``min(1, (silent_s - timeout_s) / timeout_s)`` — 0 just past the timeout, 1 at twice it
(on the collective-wait path ``timeout_s`` is its bound). Evidence ``trigger`` says which path
fired: ``"timeout"`` or ``"collective_wait"``.

Example::

    >>> import numpy as np
    >>> det = HangDetector(timeout_floor_s=30.0)
    >>> for t in range(100):                    # 4 ranks push every second; rank 3 stops at t=49
    ...     ranks = np.arange(4 if t < 50 else 3)
    ...     _ = det.observe(ranks, np.full(len(ranks), t), float(t))
    >>> [(f.kind, f.ranks, f.step) for f in det.tick(100.0)]  # rank 3 silent since t=49
    [('hang', (3,), 50)]
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from healthsvc_detectors.base import AbsenceDetector, Detector
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.hang.judging import HangJudging
from healthsvc_detectors.hang.state import _NEVER


class HangDetector(HangJudging, Detector, AbsenceDetector):
    """Absence of progress: ``hang`` (some ranks) and ``stall`` (all ranks)."""

    kind = "hang"
    # Silence that ends is news, its absence is not: both resolve on the detector's own word. A
    # stall explains the hangs and stragglers of its run.
    kinds = (Kind("hang", "Some ranks went silent while others still report.", resolves="explicit",
                  mutes=frozenset(), corruption=None, heals=True, onset_guessed=False, probe=False,
                  incident=None, restarts_at="warning", blames_host=True, label="hang", colour="#7f7f7f"),
             Kind("stall", "Every rank went silent: the job makes no progress.", resolves="explicit",
                  mutes=frozenset({"hang", "straggler"}), corruption=None, heals=True,
                  onset_guessed=False, probe=False, incident="stall", restarts_at="warning", blames_host=False, label="stall",
                  colour="#17becf"))

    def __init__(
        self,
        timeout_floor_s: float = 60.0,
        timeout_factor: float = 10.0,
        startup_timeout_s: float = 600.0,
        interval_alpha: float = 0.2,
        heartbeat_timeout_s: float = 30.0,
        collective_phase: str = "collective",
        collective_wait_s: float | None = 10.0,
        collective_wait_steps: float = 3.0,
        pause_phases: Iterable[str] = ("checkpoint",),
        pause_timeout_s: float = 600.0,
    ) -> None:
        if timeout_floor_s <= 0 or timeout_factor <= 0:
            raise ValueError("timeout_floor_s and timeout_factor must be > 0, got "
                             f"{timeout_floor_s}, {timeout_factor}")
        if collective_wait_s is not None and collective_wait_s <= 0:
            raise ValueError(f"collective_wait_s must be > 0 (or null: off), got {collective_wait_s}")
        if collective_wait_steps < 0 or pause_timeout_s <= 0:
            raise ValueError("collective_wait_steps must be >= 0 and pause_timeout_s > 0, got "
                             f"{collective_wait_steps}, {pause_timeout_s}")
        self.timeout_floor_s = timeout_floor_s
        self.timeout_factor = timeout_factor
        self.startup_timeout_s = startup_timeout_s
        self.interval_alpha = interval_alpha
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.collective_phase = collective_phase
        self.collective_wait_s = None if collective_wait_s is None else float(collective_wait_s)
        self.collective_wait_steps = float(collective_wait_steps)
        self.pause_phases = (pause_phases,) if isinstance(pause_phases, str) else tuple(pause_phases)
        self.pause_timeout_s = float(pause_timeout_s)
        self._wait_floor_s = np.inf if collective_wait_s is None else float(collective_wait_s)
        super().__init__()

    # ------------------------------------------------------------------------------ input
    def set_world(self, ranks: Iterable[int], now: float) -> list[Finding]:
        """Declare the expected ranks; ranks left out stop being expected (their hangs resolve)."""
        ids = np.unique(np.asarray(list(ranks), dtype=np.int64))
        self._positions(ids, now)
        keep = np.isin(self._ids, ids)
        out = self._resolve_hangs(self._hung & ~keep, now, reason="left the world")
        self._active = keep
        self._all_active = False
        self._refresh_deadlines()
        return out

    def observe(self, ranks: np.ndarray, steps: np.ndarray, now: float) -> list[Finding]:
        """Per-rank step records arrived at ``now`` (seconds); ranks may repeat (many steps)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        steps = np.asarray(steps, dtype=np.int64)
        if len(ranks) == 0:
            return []
        whole = len(ranks) == len(self._ids) and bool((ranks == self._ids).all())
        if not whole and len(ranks) > 1 and not (ranks[1:] > ranks[:-1]).all():
            # Several records per rank: keep each rank's newest (highest) step of this push.
            order = np.lexsort((steps, ranks))
            ranks, steps = ranks[order], steps[order]
            last = np.ones(len(ranks), dtype=bool)
            last[:-1] = ranks[1:] != ranks[:-1]
            ranks, steps = ranks[last], steps[last]
        self._finished = False   # data after finish: the run was resumed and can hang again
        pos = None if whole else self._positions(ranks, now)
        if pos is None and self._steady_push(steps, now):
            # Every rank moved: the first and last rank stand for the push's front (a
            # synchronous job's ranks are at one step; a max would be a pass over the ranks).
            self._advance_front(max(int(steps[0]), int(steps[-1])), now)
            if self._hung.any() or self._stalled or self._held:
                return self._on_progress(slice(None), None, now)
            return []
        sel = slice(None) if pos is None else pos
        prev = self._last_step[sel]
        moved = steps != prev
        if not moved.any():
            return []
        self._advance_front(int(steps.max()), now)
        self._last_progress_s = now
        had = prev >= 0
        dt = now - self._push_s[sel]
        sample = moved & had & (dt > 0)
        interval = self._interval_s[sel]
        first = sample & (interval == 0)
        later = sample & (interval > 0)
        interval = np.where(first, dt, interval)
        capped = np.minimum(dt, 4.0 * interval)
        interval = np.where(later, interval + self.interval_alpha * (capped - interval), interval)
        self._interval_s[sel] = interval
        self._last_step[sel] = np.where(moved, steps, prev)
        self._progress_s[sel] = np.where(moved, now, self._progress_s[sel])
        self._push_s[sel] = np.where(moved, now, self._push_s[sel])
        self._active[sel] = True
        self._refresh_deadlines(sel)
        return self._on_progress(sel, moved, now)

    def _steady_push(self, steps: np.ndarray, now: float) -> bool:
        """The common case in few array operations: every known rank pushed a new step and
        every push interval is known. Returns False (nothing done) otherwise."""
        interval = self._interval_s
        if not len(interval) or interval.min() <= 0 or not (steps != self._last_step).all():
            return False
        dt = now - self._push_s
        if dt.min() <= 0:
            return False
        capped = np.minimum(dt, 4.0 * interval)
        capped -= interval
        capped *= self.interval_alpha
        interval += capped
        self._last_step[:] = steps
        self._progress_s.fill(now)
        self._last_progress_s = now
        self._push_s.fill(now)
        if not self._all_active:
            self._active.fill(True)
            self._all_active = True
        np.multiply(interval, self.timeout_factor, out=self._deadline_s)
        floor = self._floor
        if len(floor) != len(interval) or (len(floor) and floor[0] != self.timeout_floor_s):
            floor = self._floor = np.full(len(interval), float(self.timeout_floor_s))
        np.maximum(self._deadline_s, floor, out=self._deadline_s)   # SIMD against an array
        self._deadline_s += now
        return True

    def _advance_front(self, top: int, now: float) -> None:
        """A push reached step ``top``: one step-duration sample when it advanced the front."""
        if top <= self._front_step:
            return
        if self._front_step >= 0 and now >= self._front_s:
            self._step_samples.append((now - self._front_s) / (top - self._front_step))
        self._front_step, self._front_s = top, now

    def heartbeat(self, rank: int, step: int, phase: str, now: float) -> list[Finding]:
        """A heartbeat of ``rank`` arrived at ``now``: it is at ``step`` (negative: unknown) in
        ``phase``."""
        self._finished = False
        j = int(np.searchsorted(self._ids, rank))
        if j == len(self._ids) or self._ids[j] != rank:
            self._positions(np.asarray([rank], dtype=np.int64), now)
            j = int(np.searchsorted(self._ids, rank))
        try:
            code = self._phases.index(phase)
        except ValueError:
            code = len(self._phases)
            self._phases.append(phase)
        known = step >= 0   # a negative step means "not told": alive, no progress information
        moved = known and self._hb_s[j] != _NEVER and int(self._hb_step[j]) != int(step)
        prev_code = int(self._hb_phase[j])
        back = code != prev_code and not moved and self._back_from_pause(j, prev_code, phase, now)
        self._hb_s[j], self._hb_phase[j] = now, code
        if known:
            self._hb_step[j] = step
        if back:
            self._back_step[j] = self._step_of(j)
        self._active[j] = True
        if moved or back:
            self._progress_s[j] = now
            self._last_progress_s = now
        if back and self._held:
            # The job that waited for the pause resumes with it (its records come later).
            self._held = False
            self._resume(now)
        interval = float(self._interval_s[j])
        timeout = (max(self.timeout_floor_s, self.timeout_factor * interval) if interval > 0
                   else max(self.timeout_floor_s, self.startup_timeout_s))
        self._deadline_s[j] = float(self._progress_s[j]) + timeout
        if not moved or not (self._stalled or self._held or self._hung[j]):
            return []
        mask = np.zeros(len(self._ids), dtype=bool)
        mask[j] = True
        return self._on_progress(slice(None), mask, now)

    def _back_from_pause(self, j: int, prev_code: int, phase: str, now: float) -> bool:
        """Rank ``j``'s heartbeat leaves the pause that excused it (the one before said a pause
        phase, was fresh, and the rank's silence is shorter than pause_timeout_s): it is back at
        work, and its record of the next step comes later. Once per step: a rank that came back
        at this step already and made no progress since is not back again."""
        return (prev_code >= 0 and self._phases[prev_code] in self.pause_phases
                and phase not in self.pause_phases and bool(self._active[j]) and not self._hung[j]
                and now - float(self._hb_s[j]) <= self.heartbeat_timeout_s
                and now - float(self._progress_s[j]) < self.pause_timeout_s
                and self._step_of(j) > int(self._back_step[j]))

    def _step_of(self, j: int) -> int:
        """The furthest step rank ``j`` told of, by record or heartbeat (-1: none)."""
        return max(int(self._last_step[j]), int(self._hb_step[j]))

    def finish(self, now: float) -> list[Finding]:
        """The run finished at ``now``: silence is normal; open hangs and the stall resolve."""
        out = self._resolve_hangs(self._hung.copy(), now, reason="run finished")
        out += self._resolve_stall(now, reason="run finished")
        self._finished = True
        return out

    def shift_clock(self, shift_s: float) -> None:
        """Move every remembered time forward by ``shift_s`` seconds (e.g. a service restart's
        downtime), so time the caller was not watching does not count as the ranks' silence."""
        self._progress_s += shift_s
        self._push_s += shift_s
        self._hb_s[self._hb_s != _NEVER] += shift_s
        self._deadline_s += shift_s
        self._last_progress_s += shift_s
        self._quiet_s += shift_s
        self._front_s += shift_s

    # ------------------------------------------------------------------------------ decisions
    def tick(self, now: float) -> list[Finding]:
        """New ``hang``/``stall`` findings at ``now`` (seconds, the caller's clock)."""
        if self._finished:
            return []
        if (now - self._last_progress_s > self._wait_floor_s and not self._stalled
                and self._step_samples):
            out = self._collective_wait(now)   # rare: the whole job has been quiet for a while
            if out:
                return out
        if not len(self._deadline_s) or not self._deadline_s.min() < now:
            return []   # the common case: one reduction
        overdue = self._deadline_s < now
        paused = self._pausing(now)
        if paused is not None and (paused := paused & self._active).any():
            if not self._going_on(paused, now):
                # The others stopped too: they may be waiting for the checkpoint in a barrier, so
                # it holds the job, and no silence is judged until the pause ends (or outlasts
                # pause_timeout_s).
                self._going_quiet()
                self._held = True
                return []
            # The job goes on while these ranks pause: nobody waits for them, so it is not
            # held (no clock restarts when it "resumes"); only their own silence is excused,
            # until it outlasts pause_timeout_s.
            overdue &= ~paused
        timeout = self._timeouts()
        silent = now - self._progress_s
        if overdue[self._active].all():
            return [] if self._stalled else self._stall(now, silent, timeout)
        # The job goes on without a rank when some rank progressed after that rank's deadline.
        latest = self._progress_s[self._active].max()
        new = overdue & ~self._hung & (latest > self._deadline_s)
        out = [self._hang(j, now, silent, timeout, culprit=False) for j in np.flatnonzero(new)]
        return out

    def _pausing(self, now: float) -> np.ndarray | None:
        """Ranks excused by a pause phase (fresh heartbeat, silent < pause_timeout_s), or None."""
        codes = [i for i, p in enumerate(self._phases) if p in self.pause_phases]
        if not codes:
            return None
        return (np.isin(self._hb_phase, codes) & (now - self._hb_s <= self.heartbeat_timeout_s)
                & (now - self._progress_s < self.pause_timeout_s))

    def _going_on(self, paused: np.ndarray, now: float) -> bool:
        """Some expected rank that does not pause progresses: its last record with a new step
        came within its timeout. Records only: a rank's clock also starts when it is first
        known, or restarts when a stall ends, and neither shows the job going on."""
        others = self._active & ~paused & (self._last_step >= 0)
        if not others.any():
            return False
        return bool((self._push_s[others] + self._timeouts(self._interval_s[others]) >= now).any())

    def _on_progress(self, sel: slice | np.ndarray, moved: np.ndarray | None,
                     now: float) -> list[Finding]:
        mask = np.zeros(len(self._ids), dtype=bool)
        mask[sel] = True if moved is None else moved
        was_stalled = self._stalled or self._held
        self._held = False
        out = self._resolve_stall(now, reason="progress resumed")
        if was_stalled:
            self._resume(now)
        return out + self._resolve_hangs(mask & self._hung, now, reason="progress resumed")

    def _resume(self, now: float) -> None:
        """A stall (or a pause that held the job) ends at ``now``."""
        # Every rank resumes, but their records arrive one by one: measure the silence of the
        # ranks that waited from the end of the stall, or they would be reported hung for the
        # moment between two arrivals. A rank whose deadline had passed before the job went quiet
        # (the job went on without it: tick's test for a new hang) or whose hang is open did not
        # wait: it was already hanging, and keeps its silence. The ranks that moved are at
        # ``now`` already.
        waited = self._active & ~self._hung & (self._deadline_s >= self._quiet_s)
        self._progress_s[waited] = np.maximum(self._progress_s[waited], now)
        self._refresh_deadlines()
