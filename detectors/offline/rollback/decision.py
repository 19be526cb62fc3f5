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

>>> from healthsvc_detectors.offline.onset import OnsetEstimate
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

from dataclasses import replace
from typing import Any, Iterable, Sequence

from healthsvc_detectors.finding import Finding
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.offline.bisection import Bisection
from healthsvc_detectors import kinds as kind_table
from healthsvc_detectors.offline.onset import OnsetEstimate, OnsetParams, SignalEstimate, estimate_onset_near
from healthsvc_detectors.offline.onset_signals import rank_rise_began_abruptly, rise_began_abruptly
from healthsvc_detectors.offline.rollback.evidence import (RESTART_BLOWUP_STEPS, Episode, ReplicaProof, episodes,
                                                 evidence_episodes, onset_window, replica_proof,
                                                 restart_blowup)
from healthsvc_detectors.offline.rollback.records import Checkpoint, Restart, RollbackDecision

# Checkpoints the decision may pass over beyond the newest one before the point estimate, when
# the onset interval is wide: the conservative direction, but one checkpoint of margin.
MAX_MARGIN_CHECKPOINTS = 1
# How far before a drift's guessed onset, in detection delays, the onset is placed when the
# history does not date the drift (:func:`_undated_drift`); the evidence window allows four.
UNDATED_DRIFT_DELAYS = 2


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
       :func:`healthsvc_detectors.offline.onset.estimate_onset_near`); recorded non-evidence findings inside that
       window count as hints too (a leading gradient jump). A drift-kind episode whose rise the
       history shows began with a jump (:func:`rise_began_abruptly`; for an episode naming some
       ranks, also their own loss against their peers': :func:`rank_rise_began_abruptly`) takes
       the abrupt window.
    4. Evidence in the first ``RESTART_BLOWUP_STEPS`` steps after a restart blames the restore:
       the answer is the checkpoint the run resumed from (such an episode counts even when it
       recovered, see :func:`evidence_episodes`).
    5. A ``replica_mismatch`` (the replicas' digests agreed at step L and disagreed at F) is proof:
       the first corrupted update is in ``L+1..F`` and the newest checkpoint at or before L is
       clean by proof, not by estimate (:func:`replica_proof`). The history, when it holds the
       digests, dates L and F by its whole rows: a row the detector judged before a late rank's
       digest came is whole once stored (:func:`healthsvc_detectors.replica.redate`).
    6. Probe verdicts (``bisection``, checkpoint verdicts) override the statistics as before.
    """
    ckpts = list(checkpoints)
    restarts = list(restarts)
    eps = episodes(findings)
    if block is not None:
        eps = [_dated_by_history(block, e) for e in eps]
    evidence = evidence_episodes(eps, restarts)
    onset: OnsetEstimate | None = None
    blowup = None
    proof = replica_proof(evidence, block)
    if proof is not None:
        low, high = proof.last_agreeing_step + 1, proof.first_disagreeing_step
        signal = SignalEstimate("param_digest", low, low, high, "abrupt", 1.0, proof.ranks,
                                proof.to_dict())
        onset = OnsetEstimate(step=low, low=low, high=high, confidence=1.0,
                              signals_used=["param_digest"], per_signal={"param_digest": signal},
                              shape="abrupt", origin="hardware", ranks=proof.ranks)
    elif evidence:
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
        if onset is not None and all(e.window == "drift" for e in evidence):
            onset = _undated_drift(onset, evidence, search_from)
        if onset is None:  # no history to look at: the findings alone
            h = hints[0]
            onset = OnsetEstimate(step=max(search_from, h - 1), low=max(search_from, h - 1),
                                  high=h, confidence=0.1, signals_used=["findings"],
                                  per_signal={})
    decision = choose_rollback(
        ckpts, onset, [f for e in evidence for f in e.findings], bisection=bisection,
        resumed_from=None if blowup is None else blowup[1],
        restart_first_step=None if blowup is None else blowup[0].first_step, proof=proof)
    decision.evidence["episodes"] = [
        e.to_dict() if e.is_evidence or e not in evidence else
        {**e.to_dict(), "evidence": True, "why": "evidence (right after a restart)"}
        for e in eps]
    return decision


def _undated_drift(onset: OnsetEstimate, evidence: Sequence[Episode],
                   search_from: int) -> OnsetEstimate:
    """A drift the history does not date: the onset no later than ``UNDATED_DRIFT_DELAYS``
    detection delays before the drift's guessed onset.

    A drift is detected long after it began, and its detector's onset is a guess (the last step
    its smoothed loss was at its best: on a falling curve a slow drift keeps the loss improving
    for a while, so the guess comes after the first corrupted update, by about as much as the
    detection then takes). When no history signal is significant either (the point rests on the
    findings, the other signals are merely located), neither the detection step nor a located
    change dates it; the estimate then reaches back within the evidence window (``search_from``,
    four delays) to two delays before the guess, and is gradual (no margin from its point).
    """
    if any(not sig.detail.get("located_after_finding")
           for name, sig in onset.per_signal.items() if name != "findings"):
        return onset
    reach = min(e.onset - UNDATED_DRIFT_DELAYS * max(0, e.first_step - e.onset) for e in evidence)
    low = min(onset.low, max(search_from, reach))
    return replace(onset, step=low, low=low, shape="gradual")


def _dated_by_history(block: StepBlock, ep: Episode) -> Episode:
    """A drift-kind episode with the step its rise jumped at, when the history shows one: the
    aggregate loss's jump after its onset, or for an episode that names some of the ranks, their
    own loss's jump against their peers' shortly before or after it (a replica's bit flip,
    :func:`rank_rise_began_abruptly`)."""
    if kind_table.kind(ep.kind).corruption != "drift":
        return ep
    jump = rise_began_abruptly(block, ep.onset)
    if jump is None and ep.ranks:
        jump = rank_rise_began_abruptly(block, ep.ranks, ep.onset)
    return ep if jump is None else replace(ep, jump_step=jump)


def choose_rollback(
    checkpoints: Iterable[Checkpoint],
    onset: OnsetEstimate | None,
    findings: Sequence[Finding] = (),
    *,
    bisection: Bisection | None = None,
    resumed_from: int | None = None,
    restart_first_step: int | None = None,
    proof: ReplicaProof | None = None,
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
    before the point estimate ``onset.step``, and a probe can recover it. With a replica
    ``proof`` every checkpoint at or before its last agreeing step is clean by proof, so no
    margin is taken.
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
    proven = chosen is not None and proof is not None and chosen.step <= proof.last_agreeing_step
    basis = ("probe" if chosen is not None and chosen.known_good else
             "restore" if restore else "proof" if proven else "interval")
    # The margin trusts the point estimate, which an abrupt onset gives to within a few steps; a
    # gradual one's point (where a fitted drift starts) comes late, since the first steps of a
    # slow drift hide in the noise, so a gradual onset keeps the interval's low.
    if (onset is not None and onset.shape == "abrupt" and not restore and not proven
            and (chosen is None or not chosen.known_good)):
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
    evidence["proof"] = None if proof is None else proof.to_dict()
    evidence["proven_clean"] = bool(proven or (chosen is not None and chosen.known_good))
    reason = _reason(chosen, onset, corruption, first_bad, live, deleted_newer,
                     bisect_candidates, contradicted, skip, origin, ranks, basis,
                     restart_first_step, proof)
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
            restart_first_step=None, proof=None) -> str:
    parts: list[str] = []
    if not corruption:
        if chosen is None:
            return "No corruption is evident, but there is no usable (non-deleted) checkpoint."
        return (f"No corruption is evident in the history or the findings, so the newest usable "
                f"checkpoint, step {chosen.step}, is the resume point.")
    if proof is not None:
        parts.append(
            f"The replicas' parameter digests agreed at step {proof.last_agreeing_step} and "
            f"disagreed at step {proof.first_disagreeing_step} (rank(s) {_steps(list(proof.ranks))} "
            f"differ): the first corrupted update is in {proof.last_agreeing_step + 1}.."
            f"{proof.first_disagreeing_step}, so a checkpoint at or before step "
            f"{proof.last_agreeing_step} is clean by proof, not by estimate.")
    elif onset is not None:
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
    elif basis == "proof":
        parts.append(f"Resume from checkpoint {chosen.step} (clean by proof).")
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
