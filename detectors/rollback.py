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

>>> from detectors.onset import OnsetEstimate
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

from detectors.bisection import Bisection
from detectors.finding import Finding
from detectors.onset import OnsetEstimate

CheckpointStatus = Literal["ok", "deleted", "verified"]
Verdict = Literal["good", "bad"]
# Findings whose presence means some update may be corrupted.
CORRUPTION_KINDS: frozenset[str] = frozenset(
    {"non_finite", "loss_spike", "grad_spike", "rank_outlier", "divergence"})


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


def choose_rollback(
    checkpoints: Iterable[Checkpoint],
    onset: OnsetEstimate | None,
    findings: Sequence[Finding] = (),
    *,
    bisection: Bisection | None = None,
) -> RollbackDecision:
    """Pick the newest checkpoint that holds no corrupted update, and say why in one paragraph.

    ``onset`` is the estimate of the first corrupted update (None: no corruption seen);
    ``findings`` are this incident's findings (they name ranks and tell data from hardware);
    ``bisection``: a bisection over the checkpoints whose verdicts count as probe evidence.
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

    def eligible(c: Checkpoint) -> bool:
        if c.known_bad or (first_bad is not None and c.step >= first_bad):
            return False
        if c.known_good:
            return True
        return limit is None or c.step < limit

    chosen = next((c for c in reversed(live) if eligible(c)), None)
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
    reason = _reason(chosen, onset, corruption, first_bad, live, deleted_newer,
                     bisect_candidates, contradicted, skip, origin, ranks)
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
            contradicted, skip, origin, ranks) -> str:
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
