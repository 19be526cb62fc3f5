"""What a supervisor should do with a run now: continue, restart (from where, without which hosts),
or stop. A pure function of the run's situation and the run's supervise policy, returning a named
reason (after Alertmanager's ``needsUpdate``/``NotifyReason``); the service gathers the inputs
(``healthsvc.supervise.service``), ``healthsvc supervise`` carries the decision out.

:func:`decide_action` looks at, in this order (the first that applies answers):

1. ``exited == 0`` or the run finished (every rank said so, whatever the job's exit status):
   **continue** (``finished``); nothing to supervise.
2. A firing ``resume_mismatch``: **stop** (``resume_mismatch``). The restore code did not continue
   the data position or the schedule; a restart runs the same code again.
3. A restart was recorded in the current attempt and the job has not exited: **continue**
   (``restart_pending``): the restarted job's attempt has not reported yet.
4. Findings of attempts after the last supervised restart's whose kind and severity the policy
   restarts on (``restart_on``) are the *cause*. None, and the job did not exit: **continue** (``healthy``
   or ``left_to_people``). None, and it exited non-zero: a crash, restarted like torchrun's
   ``--max-restarts`` would (``crash``) unless ``restart_on_crash`` is off (**stop**,
   ``crash_not_restarted``).
5. The corruption began within a few steps of a restart (the rollback answer's ``resumed_from``),
   or a cause of the same kind at the same step already caused a restart from the same checkpoint:
   **stop** (``same_corruption_again``); a third try from there would loop.
6. As many supervised restarts as ``max_restarts``: **stop** (``budget_spent``).
7. Less than ``cooldown_s`` since the last supervised restart: **continue** (``cooling_down``),
   with ``retry_after_s``.
8. No clean checkpoint in the rollback answer: **stop** (``no_clean_checkpoint``; the message
   quotes the answer's reason, which says why none is clean).
9. The hosts blamed by causes of the ``leave_out_kinds`` are left out; when that leaves no rank:
   **stop** (``no_hosts_left``).
10. Otherwise **restart** (``finding`` or ``crash``) from the rollback answer's checkpoint.

Example:

>>> ck = RollbackView(step=99, uri="file:///c/99", checkpoint_id=1, proven_clean=False)
>>> nan = Cause(id=7, kind="non_finite", severity="critical", step=120, ranks=(2,), hosts=("n2",),
...             attempt=1)
>>> a = decide_action(Situation(findings=(nan,), rollback=ck, attempt=1, world_size=4), Policy())
>>> a.action, a.reason.value, a.checkpoint.step, a.exclude_hosts
('restart', 'finding', 99, ())
"""
from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from healthsvc_detectors import kinds as kind_table
from healthsvc_detectors.finding import SEVERITY_ORDER


def default_restart_on() -> dict[str, str]:
    """Kinds a restart helps with by default, and the lowest severity at which it does: each
    kind's ``restarts_at`` (:mod:`healthsvc_detectors.kinds`). A straggler and a slowdown cost pace, not
    correctness: they are left to people unless a run's policy says so."""
    return {k.name: k.restarts_at for k in kind_table.kinds() if k.restarts_at is not None}


def default_leave_out_kinds() -> frozenset[str]:
    """Kinds whose blamed ranks point at their machine (``blames_host``): a restart leaves those
    hosts out. A NaN or a spike on one rank may be its batch: its host stays in."""
    return frozenset(k.name for k in kind_table.kinds() if k.blames_host)

# Never a cause of a restart: the restore is what is wrong (rule 2).
NEVER_RESTART: frozenset[str] = frozenset({"resume_mismatch"})


class Reason(str, enum.Enum):
    """Why the decision is what it is (``ActionOut.reason``)."""

    FINISHED = "finished"
    HEALTHY = "healthy"
    LEFT_TO_PEOPLE = "left_to_people"
    RESTART_PENDING = "restart_pending"
    COOLING_DOWN = "cooling_down"
    FINDING = "finding"
    CRASH = "crash"
    RESUME_MISMATCH = "resume_mismatch"
    SAME_CORRUPTION_AGAIN = "same_corruption_again"
    BUDGET_SPENT = "budget_spent"
    NO_CLEAN_CHECKPOINT = "no_clean_checkpoint"
    NO_HOSTS_LEFT = "no_hosts_left"
    CRASH_NOT_RESTARTED = "crash_not_restarted"


ACTION_OF: Mapping[Reason, str] = {
    Reason.FINISHED: "continue", Reason.HEALTHY: "continue", Reason.LEFT_TO_PEOPLE: "continue",
    Reason.RESTART_PENDING: "continue", Reason.COOLING_DOWN: "continue",
    Reason.FINDING: "restart", Reason.CRASH: "restart",
    Reason.RESUME_MISMATCH: "stop", Reason.SAME_CORRUPTION_AGAIN: "stop",
    Reason.BUDGET_SPENT: "stop", Reason.NO_CLEAN_CHECKPOINT: "stop", Reason.NO_HOSTS_LEFT: "stop",
    Reason.CRASH_NOT_RESTARTED: "stop",
}


@dataclass(frozen=True)
class Policy:
    """A run's supervise policy (``PUT /v1/runs/{run}`` ``{"supervise": {...}}``)."""

    restart_on: Mapping[str, str] = field(default_factory=default_restart_on)
    leave_out_kinds: frozenset[str] = field(default_factory=default_leave_out_kinds)
    max_restarts: int = 3
    cooldown_s: float = 60.0
    restart_on_crash: bool = True

    def restarts_on(self, kind: str, severity: str) -> bool:
        low = self.restart_on.get(kind)
        return (kind not in NEVER_RESTART and low is not None
                and SEVERITY_ORDER[severity] >= SEVERITY_ORDER[low])


@dataclass(frozen=True)
class Cause:
    """A firing finding (a stored one: ``id``, ``hosts``, the ``attempt`` it was found in)."""

    id: int
    kind: str
    severity: str
    step: int
    ranks: tuple[int, ...] = ()
    hosts: tuple[str | None, ...] = ()
    attempt: int = 1


@dataclass(frozen=True)
class PastRestart:
    """A restart a supervisor recorded: when (service clock), in which attempt (the one it
    stopped), from which checkpoint, and the ``(kind, step)`` of the findings that caused it
    (empty for a crash)."""

    at_s: float
    attempt: int
    from_step: int | None
    causes: frozenset[tuple[str, int]] = frozenset()


@dataclass(frozen=True)
class RollbackView:
    """The part of the rollback answer a restart needs."""

    step: int | None                  # None: no clean checkpoint
    uri: str | None = None
    checkpoint_id: int | None = None
    proven_clean: bool = False
    resumed_from: int | None = None   # the corruption began right after a resume from this step
    reason: str = ""                  # the answer's own paragraph: why this checkpoint, or why none


@dataclass(frozen=True)
class Situation:
    findings: Sequence[Cause] = ()
    rollback: RollbackView = RollbackView(step=None)
    restarts: Sequence[PastRestart] = ()     # supervised restarts, oldest first
    attempt: int = 0                         # the run's current attempt (0: no metrics yet)
    world_size: int | None = None
    rank_hosts: Mapping[int, str] = field(default_factory=dict)
    now_s: float = 0.0
    exited: int | None = None                # the job's exit status, when it has exited
    finished: bool = False


@dataclass(frozen=True)
class Action:
    reason: Reason
    message: str
    causes: tuple[Cause, ...] = ()
    checkpoint: RollbackView | None = None
    exclude_hosts: tuple[str, ...] = ()
    ranks_by_host: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    world_size_old: int | None = None
    world_size_new: int | None = None
    retry_after_s: float | None = None
    restarts_used: int = 0

    @property
    def action(self) -> str:
        return ACTION_OF[self.reason]


def decide_action(s: Situation, p: Policy) -> Action:
    """The decision and its named reason; see the module docstring for the order of the rules."""
    used = len(s.restarts)
    last = s.restarts[-1] if s.restarts else None

    def out(reason: Reason, message: str, **kw) -> Action:
        return Action(reason, message, restarts_used=used, **kw)

    # A run every rank finished is done even when its launcher exits non-zero afterwards (a
    # teardown that fails): training it again from a checkpoint would redo finished work.
    if s.exited == 0 or s.finished:
        return out(Reason.FINISHED, "The run finished; there is nothing to supervise.")
    mismatch = [f for f in s.findings if f.kind == "resume_mismatch"]
    if mismatch:
        return out(Reason.RESUME_MISMATCH,
                   f"A resume_mismatch at step {mismatch[0].step} says the restore did not continue "
                   "the data position or the schedule; a restart would run the same restore code, so "
                   "fix it first.", causes=tuple(mismatch))
    if last is not None and s.exited is None and last.attempt >= s.attempt:
        return out(Reason.RESTART_PENDING, "A restart was recorded and its attempt has not reported "
                                           "yet; waiting for it.")
    # What a recorded restart acted on is handled: only findings of the attempts after it count.
    since = last.attempt if last is not None else -1
    new = [f for f in s.findings if f.attempt > since]
    causes = tuple(f for f in new if p.restarts_on(f.kind, f.severity))
    if not causes and s.exited is None:
        if new:
            kinds = ", ".join(sorted({f.kind for f in new}))
            return out(Reason.LEFT_TO_PEOPLE, f"Open findings ({kinds}) are not ones this run's "
                                              "policy restarts on; they are left to people.")
        return out(Reason.HEALTHY, "No open finding calls for a restart.")
    crash = not causes
    if crash and not p.restart_on_crash:
        return out(Reason.CRASH_NOT_RESTARTED, f"The job exited with status {s.exited}, no finding "
                                               "explains it, and this run's policy does not restart "
                                               "crashes.")
    same = _same_corruption(s, causes)
    if same is not None:
        return out(Reason.SAME_CORRUPTION_AGAIN, same, causes=causes)
    # A condition seen in two metrics (a NaN loss and gradient norm) is said once.
    what = (f"the job exited with status {s.exited} and no finding explains it" if crash else
            "; ".join(dict.fromkeys(f"{f.kind} ({f.severity}) at step {f.step}" for f in causes)))
    if used >= p.max_restarts:
        return out(Reason.BUDGET_SPENT, f"The restart budget of {p.max_restarts} is spent, so "
                                        f"{what} ends the run.", causes=causes)
    if last is not None and s.now_s - last.at_s < p.cooldown_s:
        wait = p.cooldown_s - (s.now_s - last.at_s)
        return out(Reason.COOLING_DOWN, f"The last restart was {s.now_s - last.at_s:.0f} s ago, within "
                                        f"the cool-down of {p.cooldown_s:g} s; asking again in "
                                        f"{wait:.0f} s.", causes=causes, retry_after_s=wait)
    if s.rollback.step is None:
        # Why none is the question the person reading this asks next: the answer says it.
        why = s.rollback.reason.strip()
        why = f" The rollback answer: {why}{'' if why.endswith('.') else '.'}" if why else ""
        return out(Reason.NO_CLEAN_CHECKPOINT, f"There is no clean checkpoint to resume from after "
                                               f"{what}.{why}", causes=causes)
    hosts = tuple(sorted({h for f in causes if f.kind in p.leave_out_kinds for h in f.hosts
                          if h is not None}))
    by_host = {h: tuple(sorted(r for r, rh in s.rank_hosts.items() if rh == h)) for h in hosts}
    new_size = None if s.world_size is None else s.world_size - sum(len(r) for r in by_host.values())
    if new_size is not None and new_size < 1:
        return out(Reason.NO_HOSTS_LEFT, f"Leaving out {', '.join(hosts)} would leave no rank to "
                                         "train with.", causes=causes, exclude_hosts=hosts)
    ck = s.rollback
    without = f" without {', '.join(hosts)}" if hosts else ""
    clean = "clean by proof" if ck.proven_clean else "the newest clean checkpoint"
    return out(Reason.CRASH if crash else Reason.FINDING,
               f"Restart from step {ck.step} ({clean}){without} because {what}.", causes=causes,
               checkpoint=ck, exclude_hosts=hosts, ranks_by_host=by_host,
               world_size_old=s.world_size, world_size_new=new_size)


def _same_corruption(s: Situation, causes: tuple[Cause, ...]) -> str | None:
    """Why a restart would loop, or None."""
    target = s.rollback.step
    if causes and s.rollback.resumed_from is not None and any(
            r.from_step == s.rollback.resumed_from for r in s.restarts):
        return (f"The corruption came back within a few steps of the resume from step "
                f"{s.rollback.resumed_from}; restarting from it again would repeat it.")
    for r in s.restarts:
        again = [f for f in causes if (f.kind, f.step) in r.causes]
        if again and r.from_step == target:
            return (f"The same {again[0].kind} at step {again[0].step} came back after the restart "
                    f"from step {target}; restarting from it again would repeat it.")
    return None
