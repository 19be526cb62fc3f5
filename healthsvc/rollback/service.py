"""Rollback and bisection in the service: stored history, findings and checkpoints in, decisions out.

The maths is in :mod:`healthsvc_detectors.offline.onset`, :mod:`healthsvc_detectors.offline.rollback` and :mod:`healthsvc_detectors.offline.bisection`;
this module only gathers their inputs from the store and persists the bisection state. The
policy (what counts as evidence, the restart rule, the margin) is
:func:`healthsvc_detectors.offline.rollback.decide_rollback`'s.

- Findings of the incident: every finding of a corruption kind (``Kind.corruption`` in :mod:`healthsvc_detectors.kinds`)
  of the current attempt, firing and resolved, so the decision can tell an episode that is still
  on (or lasted) from a transient that recovered by itself.
- Restarts: each attempt after the first (it resumed at its ``start_step``) and each ``restart``
  or ``rollback`` event (see :func:`restart_points` for how their ``step`` is read).
- Checkpoints: the stored ones, their status mapped onto the decision's vocabulary (``bad`` is a
  probe verdict). A checkpoint written by an earlier attempt at or after the step a later attempt
  resumed from is *superseded* (that branch of history was abandoned) and never recommended.
- History (read only when there is evidence): the effective history (latest attempt per step) of
  ``loss``, ``grad_norm``, ``local_grad_norm`` and ``lr``, pivoted to steps x ranks; at most
  ``MAX_CELLS`` cells (the newest steps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, TYPE_CHECKING

import numpy as np

from healthsvc_detectors.finding import Finding
from healthsvc_detectors.offline.bisection import Bisection, BisectionError
from healthsvc_detectors.offline.onset import OnsetParams
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.kinds import corruption_kinds
from healthsvc_detectors.offline.rollback import (Checkpoint, Restart, RollbackDecision,
                                        decide_rollback, episodes, evidence_episodes, onset_window)
from healthsvc.errors import Conflict, InvalidInput, NotFound
from healthsvc.findings import StoredFinding
from healthsvc.history import concat_batches, iter_history_batches
from healthsvc.identity import occurrence_key
from healthsvc.rollback.proof import FINGERPRINT_FIELD, proof_note, sent_fingerprints
from healthsvc.store.bisections import CheckpointVerdict, NoBisection

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


# Findings of one attempt found but not stored yet: ``(attempt, findings)``.
Pending = tuple[int, Sequence[Finding]]

HISTORY_FIELDS = ("loss", "grad_norm", "local_grad_norm", "lr")
# Read with them: the replicas' digests and groups, which date a replica mismatch by its whole
# stored rows (healthsvc_detectors.replica.redate).
PROOF_FIELDS = (FINGERPRINT_FIELD, "replica_group")
MAX_CELLS = 50_000_000  # steps x ranks pivoted for the estimate (~1.2 GB of float64 + masks, worst)

@dataclass
class RollbackAnswer:
    decision: RollbackDecision
    findings: list[dict[str, Any]]
    checkpoint_ids: dict[int, int]       # step -> stored checkpoint id
    superseded: list[int]
    history_steps: int
    fingerprints: bool = False           # the run sent replica fingerprints (param_digest)

    def to_dict(self, run_id: str) -> dict[str, Any]:
        d = self.decision.to_dict()
        ckpt = d["checkpoint"]
        if ckpt is not None:
            ckpt["id"] = self.checkpoint_ids.get(ckpt["step"])
        onset = d["onset"]
        note = proof_note(self.fingerprints)
        return {
            "run_id": run_id,
            "checkpoint": ckpt,
            "onset": onset,
            "reason": d["reason"] if note is None else f"{d['reason']} {note}",
            "fingerprints": self.fingerprints,
            "proof": d["evidence"].get("proof"),
            "proof_note": note,
            "conservative": d["conservative"],
            "skip_data_range": d["skip_data_range"],
            "proven_clean": d["evidence"].get("proven_clean", False),
            "findings": self.findings,
            "evidence": {**d["evidence"], "superseded": self.superseded,
                         "history_steps": self.history_steps},
        }


def incident_findings(ctx: ServiceContext, run_id: str,
                      pending: Pending | None = None) -> tuple[list, int | None]:
    """Corruption-kind findings (firing and resolved) of the newest attempt, and that attempt.

    ``pending``: ``(attempt, findings)`` found but not stored yet (the run's owner asks before
    the job that stores them, so the page they cause carries the answer); counted as if stored
    (after every stored one), those already stored once only."""
    attempts = ctx.store.reads.attempts(run_id)
    current = attempts[-1]["attempt"] if attempts else None
    corruption = corruption_kinds()
    found = [sf for sf in ctx.findings.query(run_id, limit=1_000_000)
             if sf.finding.kind in corruption and (current is None or sf.attempt == current)]
    if pending is not None:
        attempt, fresh = pending
        if current is None or attempt == current:
            stored = {occurrence_key(sf.attempt, sf.finding) for sf in found}
            newest = max((sf.id for sf in found), default=0)
            for i, f in enumerate(f for f in fresh if f.kind in corruption
                                  and occurrence_key(attempt, f) not in stored):
                found.append(StoredFinding(newest + 1 + i, run_id, attempt, (None,) * len(f.ranks), 0.0, f))
    found.sort(key=lambda sf: (sf.finding.step, sf.id))
    return found, current


# Keys of a restart event's data that name the checkpoint it resumed from / its first step.
_FROM_KEYS = ("resume_from_checkpoint_step", "resume_step", "from_step", "checkpoint_step")
_FIRST_KEYS = ("first_step_after_restart", "first_step")


def restart_points(store, run_id: str, checkpoint_steps: set[int]) -> list[Restart]:
    """Where the run restarted: attempts after the first, ``restart`` and ``rollback`` events.

    A ``rollback`` event's ``step`` is the checkpoint resumed from (the events contract). A
    ``restart`` event may say which checkpoint and first step in its data (``_FROM_KEYS``,
    ``_FIRST_KEYS``); otherwise its ``step`` is read as the checkpoint resumed from when a
    checkpoint has that step (what ``examples/train.py`` sends), else as the first step trained
    after the restart (what a replay of records sends).
    """
    out = [Restart(first_step=int(a["start_step"])) for a in store.reads.attempts(run_id)[1:]
           if a["start_step"] is not None]
    for ev in store.reads.events(run_id):
        if ev["kind"] not in ("restart", "rollback"):
            continue
        data = ev.get("data") or {}
        from_step = next((int(data[k]) for k in _FROM_KEYS if _is_int(data.get(k))), None)
        first = next((int(data[k]) for k in _FIRST_KEYS if _is_int(data.get(k))), None)
        step = ev["step"]
        if from_step is None and step is not None and (
                ev["kind"] == "rollback" or int(step) in checkpoint_steps):
            from_step = int(step)
        if first is None:
            first = from_step + 1 if from_step is not None else step
        if first is not None:
            out.append(Restart(first_step=int(first), from_step=from_step))
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def stored_checkpoints(store, run_id: str) -> tuple[list[Checkpoint], dict[int, int], list[int]]:
    """(usable checkpoint records, step -> id, steps superseded by a later attempt's resume)."""
    attempts = store.reads.attempts(run_id)
    starts = {a["attempt"]: a["start_step"] for a in attempts}
    out: dict[int, Checkpoint] = {}
    ids: dict[int, int] = {}
    superseded: list[int] = []
    for row in sorted(store.reads.checkpoints(run_id), key=lambda r: (r["step"], r["id"])):
        step, attempt = int(row["step"]), int(row["attempt"])
        later_resume = [s for a, s in starts.items() if a > attempt and s is not None]
        if later_resume and step >= min(later_resume):
            superseded.append(step)
            continue
        status = row["status"]
        ckpt = Checkpoint(step=step, uri=row["uri"],
                          status="ok" if status == "bad" else status,
                          verdict="bad" if status == "bad" else None)
        out[step] = ckpt  # a later write of the same step wins
        ids[step] = int(row["id"])
    return list(out.values()), ids, superseded


def history_block(store, run_id: str, step_min: int | None = None,
                  step_max: int | None = None) -> StepBlock | None:
    """The effective history between ``step_min`` and ``step_max`` as a steps x ranks block
    (newest steps when it is too large). Only the chunks of that range are read, so the memory
    is that of the window, not of the run (a 16k-rank run is 160 M records)."""
    # The digests as numeric codes, and no string column carried (a Python object a record).
    hist = concat_batches([(attempt, batch.with_codes([FINGERPRINT_FIELD], numbers_only=True))
                           for attempt, batch in iter_history_batches(
                               store, run_id, fields={*HISTORY_FIELDS, *PROOF_FIELDS},
                               step_min=step_min, step_max=step_max)])
    if len(hist) == 0:
        return None
    steps, row_of = np.unique(hist.steps, return_inverse=True)
    ranks, col_of = np.unique(hist.ranks, return_inverse=True)
    keep_steps = max(1, MAX_CELLS // max(len(ranks), 1))
    sel: np.ndarray | slice
    if len(steps) > keep_steps:
        first = len(steps) - keep_steps
        sel = row_of >= first
        steps, row_of, col_of = steps[first:], row_of[sel] - first, col_of[sel]
    else:
        sel = slice(None)
    values, present = {}, {}
    for f in (*HISTORY_FIELDS, *PROOF_FIELDS):
        if f not in hist.values:
            continue
        v = np.full((len(steps), len(ranks)), np.nan)
        p = np.zeros((len(steps), len(ranks)), bool)
        v[row_of, col_of] = hist.values[f][sel]
        p[row_of, col_of] = hist.present[f][sel]
        values[f], present[f] = v, p
    return StepBlock(steps=steps, ranks=ranks, values=values, present=present)


def load_bisection(store, run_id: str) -> Bisection | None:
    state = store.bisections.state(run_id)
    return None if state is None else Bisection.from_dict(state)


def decide(ctx: ServiceContext, run_id: str, pending: Pending | None = None) -> RollbackAnswer:
    """The rollback answer for a run (with ``pending`` findings not stored yet: see
    :func:`incident_findings`)."""
    if not ctx.store.reads.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    found, _ = incident_findings(ctx, run_id, pending)
    ckpts, ids, superseded = stored_checkpoints(ctx.store, run_id)
    restarts = restart_points(ctx.store, run_id, {c.step for c in ckpts})
    evidence = evidence_episodes(episodes(sf.finding for sf in found), restarts)
    rested = {id(f) for e in evidence for f in e.findings}
    # The history is read only when there is something to date (no evidence, no estimate), and
    # only around the evidence: the onset window plus the samples its trend is learned from.
    block = None
    if evidence:
        _, search_from, upto = onset_window(evidence)
        step_min = max(0, search_from - 4 * OnsetParams().min_window - 64)
        block = history_block(ctx.store, run_id, step_min=step_min, step_max=upto)
    decision = decide_rollback(block, [sf.finding for sf in found], ckpts, restarts=restarts,
                               bisection=load_bisection(ctx.store, run_id))
    # The findings the decision rests on: the firing findings of the evidence episodes.
    rested_on = sorted((sf for sf in found if id(sf.finding) in rested),
                       key=lambda sf: (sf.finding.onset_step if sf.finding.onset_step is not None
                                       else sf.finding.step, sf.id))
    findings = [{"id": sf.id, "attempt": sf.attempt, **sf.finding.to_dict()} for sf in rested_on]
    return RollbackAnswer(decision, findings, ids, superseded,
                          0 if block is None else block.n_steps,
                          fingerprints=sent_fingerprints(ctx.store, run_id))


# ----------------------------------------------------------------------------- bisection

def default_bisection_steps(answer: RollbackAnswer, ckpts: list[Checkpoint]) -> list[int]:
    """The checkpoints inside the onset interval, widened to the chosen one and the first after it.

    Without an onset (no corruption seen) every usable checkpoint is a candidate.
    """
    live = sorted(c.step for c in ckpts if c.status != "deleted")
    decision = answer.decision
    if decision.onset is None:
        return live
    lo = decision.checkpoint.step if decision.checkpoint is not None else (live[0] if live else 0)
    after = [s for s in live if s >= decision.onset.high]
    hi = after[0] if after else (live[-1] if live else lo)
    return [s for s in live if lo <= s <= hi]


def bisection_status(b: Bisection, ids: dict[int, int], uris: dict[int, str]) -> dict[str, Any]:
    nxt = None if b.done else b.next_probe()
    state = b.to_dict()
    return {
        "done": b.done,
        "next_probe": None if nxt is None else {"step": nxt, "uri": uris.get(nxt),
                                                "id": ids.get(nxt)},
        "last_good": state["result"],
        "first_bad": state["first_bad"],
        "probes": b.n_probes,
        "remaining_probes": b.remaining_probes(),
        "steps": state["steps"],
        "reports": state["reports"],
    }


def start_bisection(ctx: ServiceContext, run_id: str, steps: list[int] | None, known_good: int | None,
                    known_bad: int | None):
    """Start (or replace) the run's bisection; returns it, the checkpoint ids and uris by step."""
    answer = decide(ctx, run_id) if steps is None else None
    ckpts, ids, _ = stored_checkpoints(ctx.store, run_id)
    if answer is not None:   # decided above: no steps given
        steps = default_bisection_steps(answer, ckpts)
    if not steps:
        raise Conflict(f"run {run_id!r} has no usable checkpoint to bisect",
                       loc=("body", "steps"), hint="report checkpoints first")
    known = {c.step for c in ckpts}
    unknown = [s for s in steps if s not in known]
    if unknown:
        raise InvalidInput(f"steps {unknown[:10]} are not checkpoints of run {run_id!r}",
                           loc=("body", "steps"))
    try:
        b = Bisection.start(steps, known_good=known_good, known_bad=known_bad)
    except BisectionError as exc:
        raise Conflict(str(exc), loc=("body",)) from None
    b.next_probe()  # propose the first probe now, so GET shows it
    ctx.store.bisections.submit(run_id, b.to_dict()).result()
    return b, ids, {c.step: c.uri for c in ckpts}


def report_probe(ctx: ServiceContext, run_id: str, step: int, good: bool, value: float | None, ids: dict[int, int]) -> Bisection:
    """Apply one probe report atomically and mark the checkpoint verified/bad."""
    def update(state: dict[str, Any]) -> tuple[dict[str, Any], CheckpointVerdict | None]:
        b = Bisection.from_dict(state)
        b.next_probe()
        try:
            b.report(step, good, value)
        except BisectionError as exc:
            raise Conflict(str(exc), loc=("body", "step")) from None
        b.next_probe()
        verdict = None if step not in ids else CheckpointVerdict(
            ids[step], "verified" if good else "bad", f"bisection probe{'' if value is None else f' value={value:g}'}")
        return b.to_dict(), verdict
    try:
        return Bisection.from_dict(ctx.store.bisections.submit_update(run_id, update).result())
    except NoBisection:
        raise NotFound(f"run {run_id!r} has no bisection", loc=("path", "run_id"),
                       hint="start one with POST /v1/runs/{run_id}/bisection") from None
