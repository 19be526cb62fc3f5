"""Which checkpoint to resume from: the newest one that holds no corrupted update.

A checkpoint at step ``c`` holds the state after the update of step ``c``; with ``s`` the first
corrupted update it is clean only if ``c < s`` (DESIGN.md). The onset estimate gives an interval
``[low, high]`` for ``s``; the decision takes the newest checkpoint with ``c < low``, so it is
clean whenever the interval holds the truth, and it says so when the interval is wide enough to
cost checkpoints (``conservative=True``). Direct probe evidence beats statistics: a checkpoint
verified good (by a bisection, or marked by hand) is eligible even inside the interval, and
nothing at or after a checkpoint verified bad is. A deleted checkpoint is never recommended.

When the evidence points at the data (an abrupt change on every rank at once, or run-wide spike
findings without a rank to blame) the decision suggests the range of steps whose batches to skip
on replay; when it points at hardware (one rank disagrees) it names the ranks instead.

Example:

>>> from detectors.offline.onset import OnsetEstimate
>>> ckpts = [Checkpoint(1000, "s3://run/1000"), Checkpoint(2000, "s3://run/2000"),
...          Checkpoint(3000, "s3://run/3000")]
>>> onset = OnsetEstimate(step=2400, low=2350, high=2410, confidence=0.9,
...                       signals_used=["grad_norm"], per_signal={})
>>> choose_rollback(ckpts, onset).checkpoint.step
2000
>>> choose_rollback(ckpts, None).checkpoint.step
3000
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Literal, Sequence

from detectors.offline.bisection import Bisection
from detectors.finding import SEVERITY_ORDER, Finding
from detectors.frame import StepBlock
from detectors.offline.onset import OnsetEstimate, OnsetParams, estimate_onset_near

CheckpointStatus = Literal["ok", "deleted", "verified"]
Verdict = Literal["good", "bad"]
# Findings whose presence means some update may be corrupted.
CORRUPTION_KINDS: frozenset[str] = frozenset(
    {"non_finite", "loss_spike", "grad_spike", "rank_outlier", "divergence"})
# An episode that recovered (resolved) within this many steps of its onset is a transient: the
# run got back on its curve by itself, so it is recorded but is no reason to throw progress away.
# 50 steps: well past a hard batch or a few garbage batches (1-10 steps), well short of a
# learning-rate blow-up whose loss stays up for hundreds of steps.
TRANSIENT_STEPS = 50
# Kinds whose episodes are never transients: a divergence is by nature slow and lasting. Its
# ``onset_step`` (the last step the smoothed loss was at its best) is a guess that may fall a
# little before or after the first corrupted update, so only its detection step bounds the onset.
NEVER_TRANSIENT: frozenset[str] = frozenset({"divergence"})
GUESSED_ONSET_KINDS: frozenset[str] = frozenset({"divergence"})
# How far before a finding's own onset the history may still place the first corrupted update:
# at least this many steps, and a multiple of the finding's detection delay (step - onset_step).
# Spikes and NaNs are seen within a step or two; drifts and one rank's disagreement take longer
# to show, and their detectors' onset is the last step that looked healthy, not the first bad one.
ABRUPT_KINDS: frozenset[str] = frozenset({"non_finite", "loss_spike", "grad_spike"})
LOOKBACK_STEPS = {"abrupt": 32, "gradual": 256}
LOOKBACK_DELAY_FACTOR = {"abrupt": 2, "gradual": 4}
# Evidence first seen within this many steps of the first step after a restart is a blow-up of
# the restore (a wrong state dict, a data loader restarted at the wrong place), not of the
# checkpoint it resumed from.
RESTART_BLOWUP_STEPS = 5
# Checkpoints the decision may pass over beyond the newest one before the point estimate, when
# the onset interval is wide: the conservative direction, but one checkpoint of margin.
MAX_MARGIN_CHECKPOINTS = 1


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint record: ``status`` ``verified`` means a probe found it good; ``verdict`` holds
    a probe's answer (``good``/``bad``) when there was one."""

    step: int
    uri: str = ""
    status: CheckpointStatus = "ok"
    verdict: Verdict | None = None

    def __post_init__(self) -> None:
        if self.status not in ("ok", "deleted", "verified"):
            raise ValueError(f"checkpoint status must be ok, deleted or verified; got "
                             f"{self.status!r}")
        if self.verdict not in (None, "good", "bad"):
            raise ValueError(f"checkpoint verdict must be good, bad or None; got {self.verdict!r}")

    @property
    def known_good(self) -> bool:
        return self.verdict == "good" or (self.verdict is None and self.status == "verified")

    @property
    def known_bad(self) -> bool:
        return self.verdict == "bad"

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "uri": self.uri, "status": self.status,
                "verdict": self.verdict}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Checkpoint":
        return cls(step=int(d["step"]), uri=str(d.get("uri", "")),
                   status=d.get("status", "ok"), verdict=d.get("verdict"))


@dataclass(frozen=True)
class RollbackDecision:
    """Where to resume: ``checkpoint`` (None when no checkpoint is safe) and why.

    ``skip_data_range`` is an inclusive ``(start, end)`` range of steps whose batches to skip on
    replay, when the evidence points at the data. ``conservative`` is True when the onset interval
    made the decision pass over checkpoints that are probably clean (a bisection can recover them:
    ``evidence["bisect_candidates"]``).
    """

    checkpoint: Checkpoint | None
    onset: OnsetEstimate | None
    reason: str
    conservative: bool = False
    skip_data_range: tuple[int, int] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": None if self.checkpoint is None else self.checkpoint.to_dict(),
            "onset": None if self.onset is None else self.onset.to_dict(),
            "reason": self.reason,
            "conservative": self.conservative,
            "skip_data_range": None if self.skip_data_range is None else list(self.skip_data_range),
            "evidence": self.evidence,
        }


# --------------------------------------------------------------------------------- evidence

@dataclass(frozen=True)
class Episode:
    """One condition (kind, metric, ranks) from its first firing finding to its resolution.

    ``onset`` is the earliest ``onset_step`` (else ``step``) of its firing findings, ``severity``
    the highest it reached, ``resolved_step`` the step of the resolved finding that cleared it
    (None while it is still firing).
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

    @property
    def transient(self) -> bool:
        """Recovered by itself within ``TRANSIENT_STEPS`` of its onset (never a divergence)."""
        return (self.kind not in NEVER_TRANSIENT and self.resolved_step is not None
                and self.resolved_step - self.onset <= TRANSIENT_STEPS)

    @property
    def is_evidence(self) -> bool:
        """A warning or critical episode that did not recover as a transient."""
        return SEVERITY_ORDER.get(self.severity, 0) >= SEVERITY_ORDER["warning"] and not self.transient

    @property
    def why(self) -> str:
        if SEVERITY_ORDER.get(self.severity, 0) < SEVERITY_ORDER["warning"]:
            return "info only"
        if self.transient:
            return f"recovered within {self.resolved_step - self.onset} steps"
        return "evidence" if self.resolved_step is None else (
            f"evidence (resolved after {self.resolved_step - self.onset} steps)")

    @property
    def upper_bound(self) -> int:
        """The step by which the problem existed: its onset, or for a guessed onset its
        detection."""
        return self.first_step if self.kind in GUESSED_ONSET_KINDS else self.onset

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "metric": self.metric, "ranks": list(self.ranks),
                "onset": self.onset, "first_step": self.first_step, "severity": self.severity,
                "resolved_step": self.resolved_step, "resolved_reason": self.resolved_reason,
                "evidence": self.is_evidence, "why": self.why}


def episodes(findings: Iterable[Finding]) -> list[Episode]:
    """The corruption-kind findings grouped into episodes, by onset.

    A ``resolved`` finding closes the open episode with the same kind, metric and ranks (or, when
    there is none, those of the same kind and metric whose ranks it covers); a firing finding
    while one is open joins it (an escalation).
    """
    order = sorted((f for f in findings if f.kind in CORRUPTION_KINDS),
                   key=lambda f: (f.step, f.status == "resolved"))
    open_: dict[tuple, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for f in order:
        key = (f.kind, f.metric, tuple(f.ranks))
        if f.status == "resolved":
            keys = [key] if key in open_ else [
                k for k in open_ if k[:2] == key[:2] and f.ranks and set(k[2]) <= set(f.ranks)]
            for k in keys:
                ep = open_.pop(k)
                ep.update(resolved_step=int(f.step),
                          resolved_reason=(f.evidence or {}).get("reason"))
                done.append(ep)
            continue
        ep = open_.get(key)
        if ep is None:
            ep = open_[key] = {"kind": f.kind, "metric": f.metric, "ranks": tuple(f.ranks),
                               "onset": _finding_onset(f), "first_step": int(f.step),
                               "severity": f.severity, "findings": []}
        ep["onset"] = min(ep["onset"], _finding_onset(f))
        if SEVERITY_ORDER.get(f.severity, 0) > SEVERITY_ORDER.get(ep["severity"], 0):
            ep["severity"] = f.severity
        ep["findings"].append(f)
    out = [Episode(**{**ep, "findings": tuple(ep["findings"])}) for ep in done + list(open_.values())]
    return sorted(out, key=lambda e: (e.onset, e.first_step, e.kind))


def _finding_onset(f: Finding) -> int:
    return int(f.onset_step if f.onset_step is not None else f.step)


def _lookback(ep: Episode) -> int:
    kind = "abrupt" if ep.kind in ABRUPT_KINDS else "gradual"
    delay = max(0, ep.first_step - ep.onset)
    return max(LOOKBACK_STEPS[kind], LOOKBACK_DELAY_FACTOR[kind] * delay)


def onset_window(evidence: Sequence[Episode]) -> tuple[int, int, int]:
    """``(anchor, search_from, upto)`` for the onset estimate of the evidence episodes.

    ``anchor``: the earliest evidence onset (the problem existed by then). ``search_from``: the
    earliest update the evidence allows, each episode's onset minus its lookback (spikes and NaNs
    are seen at once: ``LOOKBACK_STEPS["abrupt"]`` steps or twice the detection delay; drifts and
    rank disagreements take longer: 256 steps or four times the delay). ``upto``: the history
    used ends 64 steps after the detection of the earliest episode.
    """
    if not evidence:
        raise ValueError("onset_window needs at least one evidence episode")
    first = min(evidence, key=lambda e: (e.onset, e.first_step))
    anchor = first.onset
    search_from = min(e.onset - _lookback(e) for e in evidence)
    upto = max(anchor, first.first_step) + 64
    return anchor, search_from, upto


@dataclass(frozen=True)
class Restart:
    """A restart: ``first_step`` is the first step trained after it, ``from_step`` the checkpoint
    step it resumed from when the trainer said so (else the newest checkpoint before
    ``first_step``)."""

    first_step: int
    from_step: int | None = None


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


def decide_rollback(
    block: StepBlock | None,
    findings: Iterable[Finding],
    checkpoints: Iterable[Checkpoint],
    *,
    restarts: Iterable[Restart] = (),
    bisection: Bisection | None = None,
    params: OnsetParams = OnsetParams(),
) -> RollbackDecision:
    """The whole rollback answer from a run's history, findings, checkpoints and restarts.

    1. Evidence: episodes (:func:`episodes`) of corruption kinds that reached warning or critical
       and did not recover as transients. Info-only episodes and spikes that recovered within
       ``TRANSIENT_STEPS`` are recorded in ``evidence["episodes"]`` but are no evidence.
    2. No evidence (and no probe verdict): the newest usable checkpoint, whatever the history's
       trend looks like; no change point search at all.
    3. Evidence: the onset is estimated from the history near it (:func:`onset_window`,
       :func:`detectors.offline.onset.estimate_onset_near`); recorded non-evidence findings inside that
       window count as hints too (a leading gradient jump).
    4. Evidence in the first ``RESTART_BLOWUP_STEPS`` steps after a restart blames the restore:
       the answer is the checkpoint the run resumed from (such an episode counts even when it
       recovered, see :func:`evidence_episodes`).
    5. Probe verdicts (``bisection``, checkpoint verdicts) override the statistics as before.
    """
    ckpts = list(checkpoints)
    restarts = list(restarts)
    eps = episodes(findings)
    evidence = evidence_episodes(eps, restarts)
    onset: OnsetEstimate | None = None
    blowup = None
    if evidence:
        anchor, search_from, upto = onset_window(evidence)
        # A restart blow-up is dated by the first step known bad (a divergence's onset is the
        # last healthy step, often the one just before the restart).
        blowup = restart_blowup(min(e.upper_bound for e in evidence), restarts, ckpts)
        if blowup is not None:  # the history before the restore says nothing about it
            search_from = max(search_from, blowup[0].first_step)
        hints = sorted({e.upper_bound for e in evidence}
                       | {e.onset for e in eps
                          if e not in evidence and search_from <= e.onset <= anchor})
        if block is not None:
            onset = estimate_onset_near(block, finding_steps=hints, search_from=search_from,
                                        upto=upto, params=params)
        if onset is None:  # no history to look at: the findings alone
            h = hints[0]
            onset = OnsetEstimate(step=max(search_from, h - 1), low=max(search_from, h - 1),
                                  high=h, confidence=0.1, signals_used=["findings"],
                                  per_signal={})
    decision = choose_rollback(
        ckpts, onset, [f for e in evidence for f in e.findings], bisection=bisection,
        resumed_from=None if blowup is None else blowup[1],
        restart_first_step=None if blowup is None else blowup[0].first_step)
    decision.evidence["episodes"] = [
        e.to_dict() if e.is_evidence or e not in evidence else
        {**e.to_dict(), "evidence": True, "why": "evidence (right after a restart)"}
        for e in eps]
    return decision


# --------------------------------------------------------------------------------- decision

def choose_rollback(
    checkpoints: Iterable[Checkpoint],
    onset: OnsetEstimate | None,
    findings: Sequence[Finding] = (),
    *,
    bisection: Bisection | None = None,
    resumed_from: int | None = None,
    restart_first_step: int | None = None,
) -> RollbackDecision:
    """Pick the newest checkpoint that holds no corrupted update, and say why in one paragraph.

    ``onset`` is the estimate of the first corrupted update (None: no corruption seen);
    ``findings`` are this incident's findings (they name ranks and tell data from hardware);
    ``bisection``: a bisection over the checkpoints whose verdicts count as probe evidence.
    ``resumed_from``: the corruption began right after a restart (at ``restart_first_step``)
    that resumed from this checkpoint: the restore is to blame, so it is the answer (unless a
    probe found it bad or it is deleted).

    The statistics make a checkpoint eligible when ``c < onset.low``; when the interval is wide
    the answer passes over at most ``MAX_MARGIN_CHECKPOINTS`` checkpoint(s) beyond the newest one
    before the point estimate ``onset.step``, and a probe can recover it.
    """
    ckpts = sorted(_with_bisection(checkpoints, bisection), key=lambda c: c.step)
    live = [c for c in ckpts if c.status != "deleted"]
    bad_steps = [c.step for c in ckpts if c.known_bad]
    first_bad = min(bad_steps) if bad_steps else None
    corruption = onset is not None or first_bad is not None

    # Probe evidence: good checkpoints after a bad one contradict monotone corruption; ignore them.
    contradicted = [c.step for c in ckpts if c.known_good and first_bad is not None
                    and c.step > first_bad]
    limit = onset.low if onset is not None else None  # eligible by statistics: c < limit

    def probe_ok(c: Checkpoint) -> bool:
        return not (c.known_bad or (first_bad is not None and c.step >= first_bad))

    def eligible(c: Checkpoint) -> bool:
        if not probe_ok(c):
            return False
        if c.known_good or (resumed_from is not None and c.step == resumed_from):
            return True
        return limit is None or c.step < limit

    chosen = next((c for c in reversed(live) if eligible(c)), None)
    restore = (chosen is not None and resumed_from is not None and chosen.step == resumed_from
               and not chosen.known_good)
    basis = ("probe" if chosen is not None and chosen.known_good else
             "restore" if restore else "interval")
    if onset is not None and not restore and (chosen is None or not chosen.known_good):
        # One checkpoint of margin: never further back than MAX_MARGIN_CHECKPOINTS before the
        # newest checkpoint that precedes the point estimate.
        before_point = [c for c in live if probe_ok(c) and c.step < onset.step]
        if before_point:
            floor = before_point[max(0, len(before_point) - 1 - MAX_MARGIN_CHECKPOINTS)]
            if chosen is None or chosen.step < floor.step:
                chosen, basis = floor, "margin"
    deleted_newer = [c.step for c in ckpts if c.status == "deleted" and eligible(c)
                     and (chosen is None or c.step > chosen.step)]
    # Checkpoints passed over only because the interval is wide: after the choice, before the
    # point estimate (and not known bad). A bisection over them can win the steps back.
    bisect_candidates = []
    if onset is not None:
        bisect_candidates = [c.step for c in live
                             if (chosen is None or c.step > chosen.step) and c.step < onset.step
                             and not c.known_bad and (first_bad is None or c.step < first_bad)]
    conservative = bool(bisect_candidates)
    skip, origin, ranks = _data_or_hardware(onset, findings)

    evidence: dict[str, Any] = {
        "corruption": corruption,
        "first_verified_bad": first_bad,
        "verified_good": [c.step for c in ckpts if c.known_good and c.step not in contradicted],
        "contradicted_good": contradicted,
        "deleted_newer": deleted_newer,
        "bisect_candidates": bisect_candidates,
        "origin": origin,
        "ranks": list(ranks),
        "findings": [f.to_dict() for f in findings],
        "newest_checkpoint": None if not live else live[-1].step,
    }
    evidence["resumed_from"] = resumed_from if restore else None
    evidence["restart_first_step"] = restart_first_step if restore else None
    reason = _reason(chosen, onset, corruption, first_bad, live, deleted_newer,
                     bisect_candidates, contradicted, skip, origin, ranks, basis,
                     restart_first_step)
    return RollbackDecision(checkpoint=chosen, onset=onset, reason=reason,
                            conservative=conservative, skip_data_range=skip, evidence=evidence)


def _with_bisection(checkpoints: Iterable[Checkpoint],
                    bisection: Bisection | None) -> list[Checkpoint]:
    """Copy the bisection's verdicts onto the checkpoint records."""
    ckpts = list(checkpoints)
    if bisection is None:
        return ckpts
    good, bad = bisection.result(), bisection.first_bad()
    out = []
    for c in ckpts:
        if c.verdict is None and good is not None and c.step <= good and c.step in bisection.steps:
            c = replace(c, verdict="good")
        elif c.verdict is None and bad is not None and c.step >= bad and c.step in bisection.steps:
            c = replace(c, verdict="bad")
        out.append(c)
    return out


def _data_or_hardware(onset: OnsetEstimate | None, findings: Sequence[Finding]):
    """(skip range, origin, ranks): skip data only when every rank changed at once."""
    blamed = sorted({r for f in findings if f.kind == "rank_outlier" for r in f.ranks})
    if onset is not None and onset.origin == "hardware":
        return None, "hardware", onset.ranks
    if blamed:
        return None, "hardware", tuple(blamed)
    run_wide_spike = any(f.kind in ("loss_spike", "grad_spike") and not f.ranks for f in findings)
    if onset is not None and (onset.origin == "data" or (onset.origin == "unknown"
                                                         and run_wide_spike
                                                         and onset.shape == "abrupt")):
        end = onset.spike_end if onset.spike_end is not None else onset.high
        return (onset.low, max(end, onset.high)), "data", ()
    return None, "unknown" if onset is not None else "none", ()


def _reason(chosen, onset, corruption, first_bad, live, deleted_newer, bisect_candidates,
            contradicted, skip, origin, ranks, basis="interval",
            restart_first_step=None) -> str:
    parts: list[str] = []
    if not corruption:
        if chosen is None:
            return "No corruption is evident, but there is no usable (non-deleted) checkpoint."
        return (f"No corruption is evident in the history or the findings, so the newest usable "
                f"checkpoint, step {chosen.step}, is the resume point.")
    if onset is not None:
        width = onset.high - onset.low
        parts.append(
            f"The first corrupted update is estimated at step {onset.step} (interval "
            f"{onset.low}..{onset.high}, confidence {onset.confidence:.2f}, from "
            f"{', '.join(onset.signals_used)}); a checkpoint at step c holds the update of step c, "
            f"so only checkpoints before step {onset.low} are clean by this estimate.")
        if bisect_candidates:
            parts.append(
                f"The interval is wide ({width} steps) and covers checkpoint(s) "
                f"{_steps(bisect_candidates)} that may well be clean; to be safe they are passed "
                f"over (a bisection over them can recover the steps).")
    if first_bad is not None:
        parts.append(f"A probe found checkpoint {first_bad} bad, so nothing at or after it is "
                     f"used.")
    if contradicted:
        parts.append(f"Checkpoint(s) {_steps(contradicted)} were reported good after a bad one; "
                     f"that contradicts monotone corruption, so they are ignored.")
    if deleted_newer:
        parts.append(f"Newer clean checkpoint(s) {_steps(deleted_newer)} are deleted.")
    if chosen is None:
        parts.append("No usable checkpoint precedes the corruption: restart from scratch or "
                     "from an external snapshot.")
    elif basis == "restore":
        parts.append(
            f"The corruption shows within {RESTART_BLOWUP_STEPS} steps of the restart at step "
            f"{restart_first_step}, which resumed from checkpoint {chosen.step}: that points at "
            f"the restore (state, optimizer or data-loader position), not at the checkpoint. "
            f"Resume from checkpoint {chosen.step} again and check the restore.")
    elif basis == "margin":
        parts.append(
            f"Resume from checkpoint {chosen.step}: it is at most {MAX_MARGIN_CHECKPOINTS} "
            f"checkpoint(s) before the newest one preceding the point estimate (one checkpoint "
            f"of margin; the interval alone would pass over more).")
    else:
        how = "verified good by a probe" if chosen.known_good else "before the onset interval"
        parts.append(f"Resume from checkpoint {chosen.step} ({how}).")
    if origin == "hardware" and ranks:
        parts.append(f"The evidence points at hardware on rank(s) {_steps(list(ranks))} (they "
                     f"disagree with their peers): replace or drain them; the data need not be "
                     f"skipped.")
    elif skip is not None:
        parts.append(f"Every rank changed at once, which points at the data: skip the batches of "
                     f"steps {skip[0]}..{skip[1]} on replay.")
    return " ".join(parts)


def _steps(steps: list[int], limit: int = 6) -> str:
    if len(steps) <= limit:
        return ", ".join(str(s) for s in steps)
    return f"{', '.join(str(s) for s in steps[:limit])} and {len(steps) - limit} more"
