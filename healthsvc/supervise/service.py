"""The action answer in the service: the run's situation gathered from what the service already
knows, decided by :func:`healthsvc.supervise.policy.decide_action`.

- Findings: the active ones (``ctx.health``: unresolved, alert not resolved since) of the current
  attempt, firing.
- Checkpoint: the rollback answer (``healthsvc.rollback.service.decide``), never recomputed.
- Restarts: the run's events a supervisor recorded (``data.decided_by`` is :data:`DECIDED_BY`),
  which is also what the timeline and goodput show.
- World size: the newest ``world_size_change`` event's ``new``, else the configured size, else the
  ranks seen; hosts of ranks: the run's (each rank's newest report).

A restart or stop for a corruption finding is *settled* first (:func:`settle`): it waits, at most
``supervise_settle_s``, until every rank of the attempt has stored a step after the cause's, then
decides again on what is stored then, whether it had to wait or not: a rank may have caught up
(its checkpoints first) while the first answer was being computed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, TYPE_CHECKING

from healthsvc_detectors.kinds import corruption_kinds
from healthsvc.errors import NotFound
from healthsvc.rollback import service as rollback_service
from healthsvc.runs.service import shown_config
from healthsvc.supervise.policy import (
    Action,
    Cause,
    PastRestart,
    RollbackView,
    Situation,
    decide_action,
)
from healthsvc.supervise.schemas import SuperviseConfig

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


DECIDED_BY = "healthsvc supervise"


def past_restarts(events: list[dict]) -> list[PastRestart]:
    """The supervised restarts among a run's events, oldest first (anyone may post events, so a
    malformed ``causes`` entry is skipped, not trusted)."""
    out = []
    for ev in events:
        data = ev.get("data") or {}
        if ev["kind"] not in ("rollback", "restart") or data.get("decided_by") != DECIDED_BY:
            continue
        from_step = data.get("resume_from_checkpoint_step", ev["step"])
        causes = frozenset((str(c[0]), int(c[1])) for c in data.get("causes") or ()
                           if isinstance(c, list) and len(c) == 2 and isinstance(c[1], int))
        out.append(PastRestart(at_s=float(ev["ts"]), attempt=int(ev["attempt"]), causes=causes,
                               from_step=from_step if isinstance(from_step, int) else None))
    return out


def _world_size(store, run_id: str, config: dict, events: list[dict]) -> int | None:
    for ev in reversed(events):
        new = (ev.get("data") or {}).get("new")
        if ev["kind"] == "world_size_change" and isinstance(new, int):
            return new
    if config.get("world_size"):
        return int(config["world_size"])
    st = store.reads.run_view(run_id)
    return st.ranks_seen if st is not None and st.ranks_seen else None


def situation(ctx: ServiceContext, run_id: str, exited: int | None) -> tuple[Situation, SuperviseConfig]:
    """The inputs of the decision and the run's policy."""
    store = ctx.store
    row = store.reads.get_run_row(run_id)
    if row is None:
        raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"),
                       hint="runs are created by their first push or by PUT /v1/runs/{run_id}")
    config, _ = shown_config(row["config"])
    attempts = store.reads.attempts(run_id)
    current = attempts[-1] if attempts else None
    findings = tuple(
        Cause(id=sf.id, kind=sf.finding.kind, severity=sf.finding.severity, step=sf.finding.step,
              ranks=sf.finding.ranks, hosts=sf.hosts, attempt=sf.attempt)
        for sf in (af.stored for af in ctx.health.active(run_id))
        if sf.finding.status == "firing" and (current is None or sf.attempt == current["attempt"]))
    answer = rollback_service.decide(ctx, run_id).to_dict(run_id)
    ckpt = answer["checkpoint"]
    rollback = RollbackView(step=None if ckpt is None else ckpt["step"],
                            uri=None if ckpt is None else ckpt["uri"],
                            checkpoint_id=None if ckpt is None else ckpt["id"],
                            proven_clean=bool(answer["proven_clean"]),
                            resumed_from=answer["evidence"].get("resumed_from"),
                            reason=answer["reason"] or "")
    events = store.reads.events(run_id)
    s = Situation(findings=findings, rollback=rollback, restarts=tuple(past_restarts(events)),
                  attempt=0 if current is None else current["attempt"],
                  world_size=_world_size(store, run_id, config, events),
                  rank_hosts=store.reads.hosts(run_id), now_s=ctx.clock(), exited=exited,
                  finished=row["status"] == "finished")
    return s, SuperviseConfig.model_validate(config.get("supervise") or {})


def decide(ctx: ServiceContext, run_id: str, exited: int | None = None) -> dict[str, Any]:
    """The answer of ``GET /v1/runs/{run_id}/action`` (``ActionOut``), settled (:func:`settle`)."""
    s, config = situation(ctx, run_id, exited)
    a = decide_action(s, config.policy())
    step = settle_step(a, exited)
    if step is not None:
        settled = settle(ctx, run_id, step)
        # Decided again on what is stored now, not only when the settle waited: a rank behind
        # when the answer above was read (rank 0, its checkpoints going out before its later
        # records) may have caught up while it was computed, leaving the settle nothing to wait
        # for and that answer without the checkpoints stored meanwhile (on a loaded machine:
        # ``no_clean_checkpoint``). A decision that settles is a restart or a stop: rare.
        s, config = situation(ctx, run_id, exited)
        a = decide_action(s, config.policy())
        if settled.behind and settle_step(a, exited) is not None:
            a = replace(a, message=f"{a.message} {settled.note()}")
    return to_dict(run_id, a, config, s.attempt)


# Real seconds between two looks at the ranks' progress while a decision settles (a look is a
# copy of the run's per-rank steps, no database read).
SETTLE_POLL_S = 0.02


@dataclass(frozen=True)
class Settled:
    """How a decision's settling ended: the step the ranks were waited past, whether it waited
    at all, the bound, and the ranks still not past the step when the bound ran out (empty:
    every rank got past it)."""
    step: int
    waited: bool
    bound_s: float
    behind: tuple[int, ...] = ()

    def note(self) -> str:
        ranks = ", ".join(str(r) for r in self.behind[:8])
        more = f" and {len(self.behind) - 8} more" if len(self.behind) > 8 else ""
        return (f"Decided on what is stored after supervise_settle_s ({self.bound_s:g} s) ran out "
                f"with rank{'s' if len(self.behind) > 1 else ''} {ranks}{more} not past step "
                f"{self.step}: a checkpoint still on its way from them is not considered.")


def settle_step(a: Action, exited: int | None) -> int | None:
    """The step a decision waits for the ranks to store a step after, or None (no wait): the
    newest step of the corruption findings a restart or stop rests on, while the job runs.

    Only corruption kinds: their checkpoint is the newest one before their step (a checkpoint
    at c is clean only if c comes before the first corrupted update), and they are found in
    the values of records the ranks go on sending after them. A hang or a stall is found because
    ranks stopped (waiting on them would only spend the bound), and its checkpoint is the newest
    one anyway. No wait once the job exited: nothing of it is on its way any more."""
    if a.action == "continue" or exited is not None:
        return None
    corruption = corruption_kinds()
    steps = [f.step for f in a.causes if f.kind in corruption]
    return max(steps) if steps else None


def settle(ctx: ServiceContext, run_id: str, step: int) -> Settled:
    """Wait until every rank of the run's current attempt has stored a step after ``step``, or
    ``supervise_settle_s`` (service clock) has passed.

    Why: the records of the ranks do not reach the service in the order they were made. A
    non-finite value is sent by its rank at once, while rank 0 batches its records and sends the
    checkpoints it registered (its control queue) after the records logged before them. On a
    loaded machine the finding is stored, and the supervisor asks, before rank 0's checkpoint of
    the steps just before the cause is: the rollback answer then names an older checkpoint than
    the right one, or none (``no_clean_checkpoint``). Once a rank has stored a step after the
    cause's, what it registered before that step, checkpoints included, is in: its client sends
    a control request before the records logged after it (``healthsvc_client.sender``; a client
    from before that order may still send a checkpoint one request behind records past it). The
    bound keeps a hung or dead rank from holding the decision: after it, the decision is made on
    what is stored and its message says which ranks it did not wait for. The same lateness
    reaches the detectors: a rank's record that came after the monitor stopped waiting for its
    step is judged without, so a replica mismatch's finding can name an older agreement than the
    stored rows show; the rollback answer dates it by the stored rows
    (``healthsvc_detectors.replica.redate``), which the wait here makes whole."""
    bound = ctx.settings.supervise_settle_s
    start = ctx.clock()
    gauge = ctx.metrics.supervise_settling
    waited = False
    gauge.inc()
    try:
        while True:
            behind = ctx.store.reads.ranks_not_past(run_id, step) or ()
            if not behind:
                return Settled(step, waited, bound)
            if ctx.clock() - start >= bound:
                ctx.metrics.supervise_settle_expired.inc()
                return Settled(step, waited, bound, behind)
            waited = True
            time.sleep(SETTLE_POLL_S)
    finally:
        gauge.dec()


def to_dict(run_id: str, a: Action, config: SuperviseConfig, attempt: int) -> dict[str, Any]:
    # The checkpoint a restart resumes from; None for any other action, as for a restart without one.
    ck = a.checkpoint if a.action == "restart" else None
    world = None
    if ck is not None:
        world = {"old": a.world_size_old, "new": a.world_size_new,
                 "changes": a.world_size_old != a.world_size_new,
                 "ranks_by_host": {h: list(r) for h, r in a.ranks_by_host.items()}}
    event = None
    if ck is not None:
        corruption = any(f.kind in corruption_kinds() for f in a.causes)
        event = {"kind": "rollback" if corruption else "restart", "step": ck.step, "data": {
            "decided_by": DECIDED_BY, "reason": a.message, "reason_code": a.reason.value,
            "resume_from_checkpoint_step": ck.step, "uri": ck.uri,
            "causes": [[f.kind, f.step] for f in a.causes], "finding_ids": [f.id for f in a.causes],
            "exclude_hosts": list(a.exclude_hosts),
            "world_size": {"old": a.world_size_old, "new": a.world_size_new},
            "from_attempt": attempt}}
    return {
        "run_id": run_id, "action": a.action, "reason": a.reason.value, "message": a.message,
        "checkpoint": None if ck is None else {"step": ck.step, "uri": ck.uri,
                                                "id": ck.checkpoint_id,
                                                "proven_clean": ck.proven_clean},
        "exclude_hosts": list(a.exclude_hosts), "world_size": world,
        "findings": [{"id": f.id, "kind": f.kind, "severity": f.severity, "step": f.step,
                      "ranks": list(f.ranks), "hosts": list(f.hosts)} for f in a.causes],
        "restarts_used": a.restarts_used, "max_restarts": config.max_restarts,
        "retry_after_s": a.retry_after_s, "attempt": attempt, "event": event,
    }
