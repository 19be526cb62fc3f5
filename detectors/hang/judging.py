"""Who holds the job, and the findings that say so: the hang detector's stalls and hangs.

The collective-wait split read from the heartbeats (the fast path), the culprits of a stall and
the words naming each rank, the ``hang`` and ``stall`` findings with their evidence, and their
resolutions. The definitions are in :mod:`healthsvc_detectors.hang.detector`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from healthsvc_detectors.finding import Finding
from healthsvc_detectors.hang.state import _NEVER, HangState


class HangJudging(HangState):
    """The findings of :class:`~healthsvc_detectors.hang.detector.HangDetector` and whom they blame; they
    read its table (:class:`~healthsvc_detectors.hang.state.HangState`) and its heartbeat and collective
    settings."""

    # Declared for the type checker; the detector sets them.
    heartbeat_timeout_s: float
    collective_phase: str
    collective_wait_s: float | None
    collective_wait_steps: float
    pause_phases: tuple[str, ...]
    pause_timeout_s: float

    def _collective_wait(self, now: float) -> list[Finding]:
        """The fast path: a stall named by the heartbeats' split around a collective."""
        quiet = now - self._last_progress_s
        typical = float(np.median(self._step_samples))
        assert self.collective_wait_s is not None   # tick's floor is inf without it: not called
        limit = max(float(self.collective_wait_s), self.collective_wait_steps * typical)
        if quiet <= limit:   # longer than, as for the timeouts
            return []
        act = np.flatnonzero(self._active)
        if len(act) < 2 or self.collective_phase not in self._phases:
            return []
        hb_s = self._hb_s[act]
        # Every expected rank speaks for itself, about the silence: it kept sending heartbeats
        # through it (one after the last progress, not with it, and none older than half the
        # silence). A process that died, e.g. a rank leaving an elastic job, sent its last one
        # early in the silence: the timeouts judge it (and say "process dead?").
        fresh_s = min(self.heartbeat_timeout_s, quiet / 2)
        if not ((hb_s > self._last_progress_s) & (now - hb_s <= fresh_s)).all():
            return []
        phase, step = self._hb_phase[act], self._hb_step[act]
        pause = [i for i, p in enumerate(self._phases) if p in self.pause_phases]
        if pause and np.isin(phase, pause).any():
            return []   # a checkpoint explains the wait: the timeouts (pause_timeout_s) decide
        inside = phase == self._phases.index(self.collective_phase)
        lead = int(step[inside].max()) if inside.any() else -1
        if lead < 0:
            return []   # nobody waits in the collective, or the waiting ranks do not tell a step
        peers = inside & (step == lead)
        blamed = ~peers
        if not blamed.any() or blamed.sum() > peers.sum() or (step[blamed] > lead).any():
            return []   # no culprit, no minority, or a rank ahead of the wait: not this pattern
        culprits = act[blamed]
        words = []
        for j in culprits[:5]:
            rank, st = int(self._ids[j]), int(self._hb_step[j])
            words.append(f"rank {rank} in phase '{self._phases[int(self._hb_phase[j])]}' at "
                         + (f"step {st}" if st >= 0 else "an unknown step"))
        more = f" (and {len(culprits) - 5} more)" if len(culprits) > 5 else ""
        reason = (f"peers waiting in the collective at step {lead} ({int(peers.sum())} ranks in "
                  f"'{self.collective_phase}', no progress for {quiet:.0f} s); "
                  + "; ".join(words) + more)
        silent = now - self._progress_s
        timeout = np.full(len(self._ids), limit)
        return self._stall(now, silent, timeout, found=(culprits.tolist(), reason),
                           trigger="collective_wait", extra={"step_s": round(typical, 3)})

    def _stall(self, now: float, silent: np.ndarray, timeout: np.ndarray, *,
               found: tuple[list[int], str] | None = None, trigger: str = "timeout",
               extra: dict[str, Any] | None = None) -> list[Finding]:
        self._going_quiet()
        self._stalled = True
        act = np.flatnonzero(self._active)
        culprits, reason = self._culprits(act, now) if found is None else found
        step = int(self._last_step[act].min()) + 1
        phases = {}
        for code, count in zip(*np.unique(self._hb_phase[act], return_counts=True)):
            phases["none" if code < 0 else self._phases[code]] = int(count)
        quiet = float(silent[act].min())
        limit = float(timeout[act].max())
        out = [Finding(
            kind="stall", step=step, ranks=(), severity="critical",
            score=round(min(1.0, max(0.0, (quiet - limit) / limit)), 4),
            onset_step=step,
            evidence={"silent_s": round(quiet, 3), "timeout_s": round(limit, 3),
                      "n_ranks": int(len(act)),
                      "culprits": [int(self._ids[j]) for j in culprits], "reason": reason,
                      "phases": phases, "trigger": trigger, **(extra or {})})]
        for j in culprits:
            if not self._hung[j]:
                out.append(self._hang(j, now, silent, timeout, culprit=True, why=reason,
                                      trigger=trigger))
        return out

    def _culprits(self, act: np.ndarray, now: float) -> tuple[list[int], str]:
        """Ranks blamed for a stall, from heartbeats, and the reason in words."""
        fresh = (self._hb_s[act] != _NEVER) & (now - self._hb_s[act] <= self.heartbeat_timeout_s)
        if not fresh.any():
            return [], "no rank made progress and no heartbeats arrive: the cause is not known"
        coll = self._phases.index(self.collective_phase) if self.collective_phase in self._phases else -2
        inside = fresh & (self._hb_phase[act] == coll)
        if not inside.any():
            return [], "no rank made progress; no rank waits in the collective"
        lead = int(self._hb_step[act][inside].max())
        outside = ~inside
        behind = inside & (self._hb_step[act] < lead)
        blamed = outside | behind
        if not blamed.any():
            return [], (f"all {len(act)} ranks wait inside the collective at step {lead}: "
                        "suspect the collective or the network, not a rank")
        if blamed.sum() >= inside.sum():
            return [], (f"{int(blamed.sum())} ranks outside the collective and {int(inside.sum())} "
                        "inside: no single culprit")
        names = []
        for j in act[blamed][:5]:
            names.append(self._rank_words(int(j), now))
        return act[blamed].tolist(), (f"{int((inside & ~behind).sum())} ranks wait in "
                                      f"'{self.collective_phase}' at step {lead} while "
                                      + "; ".join(names))

    def _rank_words(self, j: int | np.integer, now: float) -> str:
        rank = int(self._ids[j])
        if self._hb_s[j] == _NEVER:
            return f"rank {rank} never sent a heartbeat"
        age = now - self._hb_s[j]
        phase = self._phases[int(self._hb_phase[j])]
        if age > self.heartbeat_timeout_s:
            return f"rank {rank} sent no heartbeat for {age:.0f} s (last in '{phase}'): process dead?"
        return f"rank {rank} is in '{phase}' at step {int(self._hb_step[j])}"

    def _hang(self, j: int | np.integer, now: float, silent: np.ndarray, timeout: np.ndarray, *, culprit: bool,
              why: str | None = None, trigger: str = "timeout") -> Finding:
        self._hung[j] = True
        rank = int(self._ids[j])
        step = int(self._last_step[j]) + 1
        quiet, limit = float(silent[j]), float(timeout[j])
        if why is None:
            why = (f"rank {rank} silent for {quiet:.0f} s while its peers progress"
                   if self._hb_s[j] == _NEVER
                   else f"{self._rank_words(j, now)}; no progress for {quiet:.0f} s "
                        "while its peers progress")
            if (self._hb_s[j] != _NEVER and now - self._hb_s[j] <= self.heartbeat_timeout_s
                    and self._phases[int(self._hb_phase[j])] in self.pause_phases):
                why += f" (a pause longer than pause_timeout_s, {self.pause_timeout_s:.0f} s)"
        evidence: dict[str, Any] = {
            "silent_s": round(quiet, 3), "timeout_s": round(limit, 3),
            "last_step": int(self._last_step[j]), "interval_s": round(float(self._interval_s[j]), 3),
            "culprit": culprit, "reason": why, "trigger": trigger,
        }
        if self._hb_s[j] != _NEVER:
            evidence.update(phase=self._phases[int(self._hb_phase[j])],
                            heartbeat_age_s=round(now - float(self._hb_s[j]), 3),
                            heartbeat_step=int(self._hb_step[j]))
        return Finding(kind="hang", step=step, ranks=(rank,), severity="critical",
                       score=round(min(1.0, max(0.0, (quiet - limit) / limit)), 4),
                       onset_step=step, evidence=evidence)

    def _resolve_hangs(self, mask: np.ndarray, now: float, reason: str) -> list[Finding]:
        out = []
        for j in np.flatnonzero(mask):
            self._hung[j] = False
            out.append(Finding(kind="hang", step=int(max(self._last_step[j], 0)),
                               ranks=(int(self._ids[j]),), severity="info", status="resolved",
                               evidence={"reason": reason, "at_s": now}))
        return out

    def _resolve_stall(self, now: float, reason: str) -> list[Finding]:
        if not self._stalled:
            return []
        self._stalled = False
        act = self._active
        step = int(self._last_step[act].max()) if act.any() else 0
        return [Finding(kind="stall", step=max(step, 0), severity="info", status="resolved",
                        evidence={"reason": reason, "at_s": now})]
