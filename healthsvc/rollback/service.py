"""Rollback and bisection in the service: stored history, findings and checkpoints in, decisions out.

The maths is in :mod:`detectors.onset`, :mod:`detectors.rollback` and :mod:`detectors.bisection`;
this module only gathers their inputs from the store and persists the bisection state.

- Findings of the incident: the corruption kinds (``detectors.rollback.CORRUPTION_KINDS``) that
  fired in the current attempt, resolved since or not (a spike that is over still passed through
  the weights). A finding's ``onset_step`` (when its detector set one) dates it,
  else its ``step``.
- Checkpoints: the stored ones, their status mapped onto the decision's vocabulary (``bad`` is a
  probe verdict). A checkpoint written by an earlier attempt at or after the step a later attempt
  resumed from is *superseded* (that branch of history was abandoned) and never recommended.
- History: the effective history (latest attempt per step) of ``loss``, ``grad_norm``,
  ``local_grad_norm`` and ``lr`` (its warm-up is skipped by the change point search), pivoted to
  steps x ranks; at most ``MAX_CELLS`` cells (the newest steps).
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from detectors.bisection import Bisection, BisectionError
from detectors.frame import StepBlock
from detectors.onset import estimate_onset_from_block
from detectors.rollback import CORRUPTION_KINDS, Checkpoint, RollbackDecision, choose_rollback
from healthsvc.errors import Conflict, InvalidInput, NotFound
from healthsvc.history import load_history

HISTORY_FIELDS = ("loss", "grad_norm", "local_grad_norm", "lr")
MAX_CELLS = 50_000_000  # steps x ranks pivoted for the estimate (~1.2 GB of float64 + masks, worst)

BISECTION_SCHEMA = """
CREATE TABLE IF NOT EXISTS bisections (
    run_id     TEXT PRIMARY KEY,
    state      TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
"""


@dataclass
class RollbackAnswer:
    decision: RollbackDecision
    findings: list[dict[str, Any]]
    checkpoint_ids: dict[int, int]       # step -> stored checkpoint id
    superseded: list[int]
    history_steps: int

    def to_dict(self, run_id: str) -> dict[str, Any]:
        d = self.decision.to_dict()
        ckpt = d["checkpoint"]
        if ckpt is not None:
            ckpt["id"] = self.checkpoint_ids.get(ckpt["step"])
        onset = d["onset"]
        return {
            "run_id": run_id,
            "checkpoint": ckpt,
            "onset": onset,
            "reason": d["reason"],
            "conservative": d["conservative"],
            "skip_data_range": d["skip_data_range"],
            "findings": self.findings,
            "evidence": {**d["evidence"], "superseded": self.superseded,
                         "history_steps": self.history_steps},
        }


def incident_findings(ctx, run_id: str) -> tuple[list, int | None]:
    """Corruption findings that fired in the newest attempt, and that attempt."""
    attempts = ctx.store.attempts(run_id)
    current = attempts[-1]["attempt"] if attempts else None
    # Resolved or not: a spike that is over has still passed through the weights.
    found = [sf for sf in ctx.findings.query(run_id, status="firing", limit=100_000)
             if sf.finding.kind in CORRUPTION_KINDS and (current is None or sf.attempt == current)]
    found.sort(key=lambda sf: (sf.finding.onset_step or sf.finding.step, sf.id))
    return found, current


def stored_checkpoints(store, run_id: str) -> tuple[list[Checkpoint], dict[int, int], list[int]]:
    """(usable checkpoint records, step -> id, steps superseded by a later attempt's resume)."""
    attempts = store.attempts(run_id)
    starts = {a["attempt"]: a["start_step"] for a in attempts}
    out: dict[int, Checkpoint] = {}
    ids: dict[int, int] = {}
    superseded: list[int] = []
    for row in sorted(store.checkpoints(run_id), key=lambda r: (r["step"], r["id"])):
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


def history_block(store, run_id: str) -> StepBlock | None:
    """The effective history as a steps x ranks block (newest steps when it is too large)."""
    hist = load_history(store, run_id, fields=set(HISTORY_FIELDS))
    if len(hist) == 0:
        return None
    steps, row_of = np.unique(hist.steps, return_inverse=True)
    ranks, col_of = np.unique(hist.ranks, return_inverse=True)
    keep_steps = max(1, MAX_CELLS // max(len(ranks), 1))
    if len(steps) > keep_steps:
        first = len(steps) - keep_steps
        sel = row_of >= first
        steps, row_of, col_of = steps[first:], row_of[sel] - first, col_of[sel]
    else:
        sel = slice(None)
    values, present = {}, {}
    for f in HISTORY_FIELDS:
        if f not in hist.values:
            continue
        v = np.full((len(steps), len(ranks)), np.nan)
        p = np.zeros((len(steps), len(ranks)), bool)
        v[row_of, col_of] = hist.values[f][sel]
        p[row_of, col_of] = hist.present[f][sel]
        values[f], present[f] = v, p
    return StepBlock(steps=steps, ranks=ranks, values=values, present=present)


def load_bisection(store, run_id: str) -> Bisection | None:
    row = store.read_conn().execute("SELECT state FROM bisections WHERE run_id=?",
                                    (run_id,)).fetchone()
    return None if row is None else Bisection.from_dict(orjson.loads(row[0]))


def decide(ctx, run_id: str) -> RollbackAnswer:
    """The rollback answer for a run."""
    if not ctx.store.run_exists(run_id):
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"))
    found, _ = incident_findings(ctx, run_id)
    ckpts, ids, superseded = stored_checkpoints(ctx.store, run_id)
    onset = None
    block = None
    if found or any(c.known_bad for c in ckpts):
        block = history_block(ctx.store, run_id)
        finding_steps = [sf.finding.onset_step if sf.finding.onset_step is not None
                         else sf.finding.step for sf in found]
        if block is not None:
            onset = estimate_onset_from_block(block, finding_steps=finding_steps)
    decision = choose_rollback(ckpts, onset, [sf.finding for sf in found],
                               bisection=load_bisection(ctx.store, run_id))
    findings = [{"id": sf.id, "attempt": sf.attempt, **sf.finding.to_dict()} for sf in found]
    return RollbackAnswer(decision, findings, ids, superseded,
                          0 if block is None else block.n_steps)


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


def start_bisection(ctx, run_id: str, steps: list[int] | None, known_good: int | None,
                    known_bad: int | None):
    """A writer job factory: replace the run's bisection with a new one."""
    answer = decide(ctx, run_id) if steps is None else None
    ckpts, ids, _ = stored_checkpoints(ctx.store, run_id)
    if steps is None:
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
    now = ctx.clock()

    def job(conn: sqlite3.Connection) -> Bisection:
        conn.execute("INSERT OR REPLACE INTO bisections (run_id, state, created_at, updated_at)"
                     " VALUES (?, ?, ?, ?)", (run_id, orjson.dumps(b.to_dict()).decode(), now, now))
        return b
    return job, ids, {c.step: c.uri for c in ckpts}


def report_job(ctx, run_id: str, step: int, good: bool, value: float | None, ids: dict[int, int]):
    """A writer job: apply one probe report atomically and mark the checkpoint verified/bad."""
    now = ctx.clock()

    def job(conn: sqlite3.Connection) -> Bisection:
        row = conn.execute("SELECT state FROM bisections WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"run {run_id!r} has no bisection", loc=("path", "run_id"),
                           hint="start one with POST /v1/runs/{run_id}/bisection")
        b = Bisection.from_dict(orjson.loads(row[0]))
        b.next_probe()
        try:
            b.report(step, good, value)
        except BisectionError as exc:
            raise Conflict(str(exc), loc=("body", "step")) from None
        b.next_probe()
        conn.execute("UPDATE bisections SET state=?, updated_at=? WHERE run_id=?",
                     (orjson.dumps(b.to_dict()).decode(), now, run_id))
        if step in ids:
            conn.execute("UPDATE checkpoints SET status=?, note=? WHERE run_id=? AND id=?",
                         ("verified" if good else "bad",
                          f"bisection probe{'' if value is None else f' value={value:g}'}",
                          run_id, ids[step]))
        return b
    return job
