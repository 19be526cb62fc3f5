"""The supervise policy (healthsvc.supervise.policy.decide_action), table-driven: every finding
kind at every severity, then each rule and the order the rules are applied in."""
from __future__ import annotations

from dataclasses import replace

import pytest

from healthsvc_detectors.finding import SEVERITY_ORDER
from healthsvc_detectors.registry import FINDING_KINDS
from healthsvc.supervise.policy import (
    Cause,
    PastRestart,
    Policy,
    Reason,
    RollbackView,
    Situation,
    decide_action,
)

C, R, S = "continue", "restart", "stop"
# kind -> the action for one firing finding at info, warning, critical (default policy, a clean
# checkpoint, no restart yet), and whether a restart leaves the blamed host out.
EXPECTED: dict[str, tuple[tuple[str, str, str], bool]] = {
    "non_finite":       ((C, R, R), False),
    "loss_spike":       ((C, C, R), False),
    "grad_spike":       ((C, C, R), False),
    "straggler":        ((C, C, C), True),
    "slowdown":         ((C, C, C), False),
    "hang":             ((C, R, R), True),
    "stall":            ((C, R, R), False),
    "rank_outlier":     ((C, R, R), True),
    "divergence":       ((C, R, R), False),
    "replica_mismatch": ((C, R, R), True),
    "resume_mismatch":  ((S, S, S), False),
}
SEVERITIES = sorted(SEVERITY_ORDER, key=SEVERITY_ORDER.get)
CKPT = RollbackView(step=99, uri="file:///c/99", checkpoint_id=3, proven_clean=False)
HOSTS = {0: "n0", 1: "n0", 2: "n1", 3: "n1"}


def finding(kind="non_finite", severity="critical", step=120, ranks=(2,), attempt=1, id=7):
    return Cause(id=id, kind=kind, severity=severity, step=step, ranks=ranks,
                 hosts=tuple(HOSTS[r] for r in ranks), attempt=attempt)


def situation(*findings, **kw) -> Situation:
    base = {"findings": findings, "rollback": CKPT, "world_size": 4, "rank_hosts": HOSTS,
            "now_s": 100.0, "attempt": 1}
    return Situation(**{**base, **kw})


def test_the_table_covers_every_finding_kind():
    assert set(EXPECTED) == set(FINDING_KINDS)


@pytest.mark.parametrize("kind", FINDING_KINDS)
@pytest.mark.parametrize("severity", SEVERITIES)
def test_one_finding_of_each_kind_and_severity(kind, severity):
    actions, leaves_host_out = EXPECTED[kind]
    a = decide_action(situation(finding(kind, severity)), Policy())
    assert a.action == actions[SEVERITIES.index(severity)], a
    assert a.message.endswith(".") and "\n" not in a.message
    if a.action == R:
        assert a.reason is Reason.FINDING and a.checkpoint == CKPT
        assert a.exclude_hosts == (("n1",) if leaves_host_out else ())
        assert (a.world_size_old, a.world_size_new) == (4, 2 if leaves_host_out else 4)
        assert [c.id for c in a.causes] == [7]
    elif a.action == S:
        assert a.reason is Reason.RESUME_MISMATCH and "restore" in a.message
    else:
        assert a.reason is Reason.LEFT_TO_PEOPLE and kind in a.message and a.checkpoint is None


NAN = finding()
DONE = PastRestart(at_s=50.0, attempt=1, from_step=99, causes=frozenset({("non_finite", 120)}))

# (name, situation, policy, action, reason)
RULES = [
    ("no finding", situation(), Policy(), C, Reason.HEALTHY),
    ("job exited 0", situation(NAN, exited=0), Policy(), C, Reason.FINISHED),
    ("run finished", situation(NAN, finished=True), Policy(), C, Reason.FINISHED),
    ("a run that finished, then its launcher failed", situation(exited=1, finished=True), Policy(), C,
     Reason.FINISHED),
    ("crash with no finding", situation(exited=1), Policy(), R, Reason.CRASH),
    ("crash killed by a signal", situation(exited=-9), Policy(), R, Reason.CRASH),
    ("crash, policy says no", situation(exited=1), Policy(restart_on_crash=False), S,
     Reason.CRASH_NOT_RESTARTED),
    ("crash, budget spent", situation(exited=1, restarts=(DONE,) * 3), Policy(), S,
     Reason.BUDGET_SPENT),
    ("restart recorded, new attempt not yet", situation(NAN, restarts=(DONE,), attempt=1),
     Policy(), C, Reason.RESTART_PENDING),
    ("restart recorded, then the job crashed before reporting",
     situation(exited=1, restarts=(DONE,), attempt=1), Policy(cooldown_s=0), R, Reason.CRASH),
    ("findings from before the last restart are handled",
     situation(NAN, restarts=(DONE,), attempt=2), Policy(), C, Reason.HEALTHY),
    ("a new finding after the restart", situation(finding(step=300, attempt=2), restarts=(DONE,),
                                                  attempt=2), Policy(cooldown_s=0), R,
     Reason.FINDING),
    ("within the cool-down", situation(finding(step=300, attempt=2), restarts=(DONE,),
                                       attempt=2, now_s=80.0), Policy(cooldown_s=60), C,
     Reason.COOLING_DOWN),
    ("the same corruption after a resume from the same checkpoint",
     situation(finding(attempt=2), restarts=(DONE,), attempt=2), Policy(cooldown_s=0),
     S, Reason.SAME_CORRUPTION_AGAIN),
    ("corruption right after the resume (the rollback answer blames the restore)",
     situation(finding(step=101, attempt=2), restarts=(DONE,), attempt=2,
               rollback=replace(CKPT, resumed_from=99)), Policy(cooldown_s=0), S,
     Reason.SAME_CORRUPTION_AGAIN),
    ("budget spent", situation(finding(step=300, attempt=2), restarts=(replace(DONE, at_s=1.0),) * 3,
                               attempt=2), Policy(cooldown_s=0), S, Reason.BUDGET_SPENT),
    ("budget of zero", situation(NAN), Policy(max_restarts=0), S, Reason.BUDGET_SPENT),
    ("no clean checkpoint", situation(NAN, rollback=RollbackView(step=None)), Policy(), S,
     Reason.NO_CLEAN_CHECKPOINT),
    ("leaving the blamed hosts out leaves nobody",
     situation(finding("hang", ranks=(0, 1, 2, 3))), Policy(), S, Reason.NO_HOSTS_LEFT),
    ("resume_mismatch beats a restartable finding and a spent budget",
     situation(NAN, finding("resume_mismatch", step=101, id=8), restarts=(replace(DONE, at_s=1.0),) * 5,
               attempt=2), Policy(), S, Reason.RESUME_MISMATCH),
    ("a kind the run's policy adds", situation(finding("straggler", "warning")),
     Policy(restart_on={"straggler": "warning"}), R, Reason.FINDING),
    ("a kind the run's policy drops", situation(NAN), Policy(restart_on={}), C, Reason.LEFT_TO_PEOPLE),
]


@pytest.mark.parametrize("name,s,policy,action,reason", RULES, ids=[r[0] for r in RULES])
def test_each_rule(name, s, policy, action, reason):
    a = decide_action(s, policy)
    assert (a.action, a.reason) == (action, reason), a.message
    assert a.message and a.message[0].isupper() and a.message.endswith(".")
    assert a.restarts_used == len(s.restarts)
    if reason is Reason.COOLING_DOWN:
        assert a.retry_after_s == pytest.approx(30.0)
    if reason is Reason.CRASH:
        assert a.causes == () and a.checkpoint == CKPT and "exited with status" in a.message


def test_a_proven_checkpoint_and_the_left_out_host_are_in_the_sentence():
    flip = finding("replica_mismatch", ranks=(2,))
    a = decide_action(situation(flip, rollback=replace(CKPT, proven_clean=True)), Policy())
    assert a.message == ("Restart from step 99 (clean by proof) without n1 because replica_mismatch "
                         "(critical) at step 120.")
    assert a.ranks_by_host == {"n1": (2, 3)} and a.world_size_new == 2


def test_no_clean_checkpoint_says_why_in_the_rollback_answers_words():
    why = "The corruption began at step 5 (4-6); every checkpoint (9, 19) comes after it."
    a = decide_action(situation(NAN, rollback=RollbackView(step=None, reason=why)), Policy())
    assert a.reason is Reason.NO_CLEAN_CHECKPOINT
    assert a.message.endswith(f"The rollback answer: {why}")
    bare = decide_action(situation(NAN, rollback=RollbackView(step=None)), Policy())
    assert bare.message.startswith("There is no clean checkpoint") and "rollback answer" not in bare.message
