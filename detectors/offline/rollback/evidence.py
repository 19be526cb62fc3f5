"""The evidence of corruption: findings grouped into episodes, and what the episodes prove.

An episode is one condition (kind, metric, ranks) from its first firing finding to its
resolution; it is evidence when it reached warning or critical and did not recover as a
transient, or when it began right after a restart (a restore gone wrong). The evidence bounds
where the onset is searched for (:func:`onset_window`), and a replica mismatch dates it by proof
(:func:`replica_proof`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from healthsvc_detectors import kinds as kind_table
from healthsvc_detectors.finding import SEVERITY_ORDER, Finding
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.replica import redate
from healthsvc_detectors.offline.rollback.records import Checkpoint, Restart

# Which findings mean that some update may be corrupted, whether an episode of one may heal as a
# transient, whether its onset is a guess and which onset window it takes are each kind's own
# (healthsvc_detectors.kinds: ``corruption``, ``heals``, ``onset_guessed``).
# An episode that recovered (resolved) within this many steps of its onset is a transient: the
# run got back on its curve by itself, so it is recorded but is no reason to throw progress away.
# 50 steps: well past a hard batch or a few garbage batches (1-10 steps), well short of a
# learning-rate blow-up whose loss stays up for hundreds of steps.
TRANSIENT_STEPS = 50
# Some kinds' episodes are never transients (``heals``: false): a divergence is by nature slow
# and lasting, and its ``onset_step`` (the last step the smoothed loss was at its best) is a guess
# that may fall a little before or after the first corrupted update (``onset_guessed``), so only
# its detection step bounds the onset. A replica or resume mismatch is proof: it does not heal.
# How far before a finding's own onset the history may still place the first corrupted update:
# at least this many steps, and a multiple of the finding's detection delay (step - onset_step).
# Spikes and NaNs are seen within a step or two; drifts and one rank's disagreement take longer
# to show, and their detectors' onset is the last step that looked healthy, not the first bad one.
# Which window a kind takes is its ``corruption`` shape: ``abrupt`` or ``drift``; a drift-kind
# episode whose rise the history shows began with a jump (``Episode.jump_step``, see
# :func:`healthsvc_detectors.offline.onset_signals.rise_began_abruptly`) takes the abrupt one: a learning
# rate blown up for 20 steps is dated as the blow-up it is, not searched for 256 steps back.
LOOKBACK_STEPS = {"abrupt": 32, "drift": 256}
LOOKBACK_DELAY_FACTOR = {"abrupt": 2, "drift": 4}
# Evidence first seen within this many steps of the first step after a restart is a blow-up of
# the restore (a wrong state dict, a data loader restarted at the wrong place), not of the
# checkpoint it resumed from.
RESTART_BLOWUP_STEPS = 5


@dataclass(frozen=True)
class Episode:
    """One condition (kind, metric, ranks) from its first firing finding to its resolution.

    ``onset`` is the earliest ``onset_step`` (else ``step``) of its firing findings, ``severity``
    the highest it reached, ``resolved_step`` the step of the resolved finding that cleared it
    (None while it is still firing). ``jump_step``: for a drift kind, the step at which its rise
    began with a jump, as its findings' evidence says (``jump_step``) or the history shows (None:
    gradual, or not looked at); the episode then takes the abrupt onset window.
    """

    kind: str
    metric: str | None
    ranks: tuple[int, ...]
    onset: int
    first_step: int
    severity: str
    resolved_step: int | None = None
    resolved_reason: str | None = None
    findings: tuple[Finding, ...] = ()
    jump_step: int | None = None

    @property
    def transient(self) -> bool:
        """Recovered by itself within ``TRANSIENT_STEPS`` of its onset (never a divergence)."""
        return (kind_table.kind(self.kind).heals and self.resolved_step is not None
                and self.resolved_step - self.onset <= TRANSIENT_STEPS)

    @property
    def is_evidence(self) -> bool:
        """A warning or critical episode that did not recover as a transient."""
        return SEVERITY_ORDER.get(self.severity, 0) >= SEVERITY_ORDER["warning"] and not self.transient

    @property
    def why(self) -> str:
        if SEVERITY_ORDER.get(self.severity, 0) < SEVERITY_ORDER["warning"]:
            return "info only"
        if self.transient and self.resolved_step is not None:   # transient: resolved
            return f"recovered within {self.resolved_step - self.onset} steps"
        return "evidence" if self.resolved_step is None else (
            f"evidence (resolved after {self.resolved_step - self.onset} steps)")

    @property
    def upper_bound(self) -> int:
        """The step by which the problem existed: its onset, or for a guessed onset its
        detection."""
        return self.first_step if kind_table.kind(self.kind).onset_guessed else self.onset

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "metric": self.metric, "ranks": list(self.ranks),
                "onset": self.onset, "first_step": self.first_step, "severity": self.severity,
                "resolved_step": self.resolved_step, "resolved_reason": self.resolved_reason,
                "evidence": self.is_evidence, "why": self.why, "window": self.window,
                "jump_step": self.jump_step}

    @property
    def window(self) -> str:
        """The onset window it takes: its kind's ``corruption`` shape, abrupt after a jump."""
        return "abrupt" if self.jump_step is not None else (
            kind_table.kind(self.kind).corruption or "drift")


def episodes(findings: Iterable[Finding]) -> list[Episode]:
    """The corruption-kind findings grouped into episodes, by onset.

    A ``resolved`` finding closes the open episode with the same kind, metric and ranks (or, when
    there is none, those of the same kind and metric whose ranks it covers); a firing finding
    while one is open joins it (an escalation).
    """
    corruption = kind_table.corruption_kinds()
    order = sorted((f for f in findings if f.kind in corruption),
                   key=lambda f: (f.step, f.status == "resolved"))
    open_: dict[tuple, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for f in order:
        key = (f.kind, f.metric, tuple(f.ranks))
        if f.status == "resolved":
            keys = [key] if key in open_ else [
                k for k in open_ if k[:2] == key[:2] and f.ranks and set(k[2]) <= set(f.ranks)]
            for k in keys:
                closed = open_.pop(k)
                closed.update(resolved_step=int(f.step),
                              resolved_reason=(f.evidence or {}).get("reason"))
                done.append(closed)
            continue
        ep = open_.get(key)
        if ep is None:
            ep = open_[key] = {"kind": f.kind, "metric": f.metric, "ranks": tuple(f.ranks),
                               "onset": _finding_onset(f), "first_step": int(f.step),
                               "severity": f.severity, "findings": []}
        ep["onset"] = min(ep["onset"], _finding_onset(f))
        # A detector that saw the jump itself says so (rank_outlier's lasting offset after a jump).
        jump = (f.evidence or {}).get("jump_step")
        if jump is not None:
            ep["jump_step"] = min(int(jump), ep.get("jump_step") or int(jump))
        if SEVERITY_ORDER.get(f.severity, 0) > SEVERITY_ORDER.get(ep["severity"], 0):
            ep["severity"] = f.severity
        ep["findings"].append(f)
    out = [Episode(**{**ep, "findings": tuple(ep["findings"])}) for ep in done + list(open_.values())]
    return sorted(out, key=lambda e: (e.onset, e.first_step, e.kind))


def _finding_onset(f: Finding) -> int:
    return int(f.onset_step if f.onset_step is not None else f.step)


def _lookback(ep: Episode) -> int:
    delay = max(0, ep.first_step - ep.onset)
    return max(LOOKBACK_STEPS[ep.window], LOOKBACK_DELAY_FACTOR[ep.window] * delay)


def onset_window(evidence: Sequence[Episode]) -> tuple[int, int, int]:
    """``(anchor, search_from, upto)`` for the onset estimate of the evidence episodes.

    ``anchor``: the earliest evidence onset (the problem existed by then). ``search_from``: the
    earliest update the evidence allows, each episode's onset minus its lookback (spikes and NaNs
    are seen at once: ``LOOKBACK_STEPS["abrupt"]`` steps or twice the detection delay; drifts and
    rank disagreements take longer: 256 steps or four times the delay, unless the rise began with
    a jump: :attr:`Episode.window`). ``upto``: the history
    used ends 64 steps after the detection of the earliest episode.
    """
    if not evidence:
        raise ValueError("onset_window needs at least one evidence episode")
    first = min(evidence, key=lambda e: (e.onset, e.first_step))
    anchor = first.onset
    search_from = min(e.onset - _lookback(e) for e in evidence)
    upto = max(anchor, first.first_step) + 64
    return anchor, search_from, upto


def restart_blowup(anchor: int, restarts: Iterable[Restart],
                   checkpoints: Iterable[Checkpoint]) -> tuple[Restart, int | None] | None:
    """The restart whose first ``RESTART_BLOWUP_STEPS`` steps the evidence begins in, and the
    checkpoint step the run resumed from (None when no checkpoint preceded it)."""
    hits = [r for r in restarts if 0 <= anchor - r.first_step <= RESTART_BLOWUP_STEPS]
    if not hits:
        return None
    r = max(hits, key=lambda r: r.first_step)
    if r.from_step is not None:
        return r, int(r.from_step)
    before = [c.step for c in checkpoints if c.step < r.first_step]
    return r, (max(before) if before else None)


def evidence_episodes(eps: Sequence[Episode], restarts: Iterable[Restart] = ()) -> list[Episode]:
    """The episodes that count as evidence of corruption.

    Those of :attr:`Episode.is_evidence`, and any warning or critical episode that begins within
    ``RESTART_BLOWUP_STEPS`` steps of a restart even if it recovered: right after a restore a
    large jump is no hard batch but a sign the state was restored wrong (optimizer moments,
    schedule or data position), which the loss coming back down does not undo.
    """
    firsts = [r.first_step for r in restarts]

    def after_restart(e: Episode) -> bool:
        return any(0 <= e.upper_bound - f <= RESTART_BLOWUP_STEPS for f in firsts)

    return [e for e in eps if e.is_evidence or (
        SEVERITY_ORDER.get(e.severity, 0) >= SEVERITY_ORDER["warning"] and after_restart(e))]


@dataclass(frozen=True)
class ReplicaProof:
    """The replicas of a group agreed (bit-identical digests) at ``last_agreeing_step`` and
    disagreed at ``first_disagreeing_step``; ``ranks`` are the odd ones."""

    last_agreeing_step: int
    first_disagreeing_step: int
    ranks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"last_agreeing_step": self.last_agreeing_step,
                "first_disagreeing_step": self.first_disagreeing_step, "ranks": list(self.ranks)}


def replica_proof(evidence: Sequence[Episode], block: StepBlock | None = None) -> ReplicaProof | None:
    """The earliest replica mismatch among the evidence, when it dates the incident.

    It does unless another evidence episode shows the problem already existed by the last
    agreeing step (then the replicas agreed on a state every one of them shared, say bad data,
    and the digests say nothing about its onset), or the group never agreed in this attempt.
    With the run's history (``block``, digests as codes), each finding's steps are those of the
    whole stored rows (:func:`healthsvc_detectors.replica.redate`): a row the detector judged
    while a rank's record was still on its way proves nothing to it, and does once stored.
    """
    found = []
    for e in evidence:
        if e.kind != "replica_mismatch":
            continue
        for f in e.findings:
            ev = f.evidence or {}
            if f.status != "firing" or not isinstance(ev.get("last_agreeing_step"), int):
                continue
            last, first_bad = int(ev["last_agreeing_step"]), int(f.step)
            if block is not None:
                last, first_bad = redate(block, last, first_bad, int(ev.get("replica_group") or 0))
            found.append((last, first_bad, f.ranks))
    if not found:
        return None
    last, first_bad = min((last, first_bad) for last, first_bad, _ in found)
    if any(e.kind != "replica_mismatch" and e.upper_bound <= last for e in evidence):
        return None
    ranks = sorted({r for agreed, _, named in found if agreed == last for r in named})
    return ReplicaProof(last, first_bad, tuple(ranks))
