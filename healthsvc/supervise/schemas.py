"""The supervise policy a run's config carries, and the answer of ``GET /v1/runs/{run_id}/action``
(the OpenAPI contract, field by field, with units).

``SuperviseConfig`` is validated when it is sent (``PUT /v1/runs/{run}``), like the detectors'
parameters, so a policy a supervisor cannot act on is a 422 naming the field, not a loop later.
"""
from __future__ import annotations

from typing import cast, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from healthsvc_detectors.registry import FINDING_KINDS
from healthsvc.limits import Seconds
from healthsvc.supervise.policy import (
    default_leave_out_kinds,
    default_restart_on,
    NEVER_RESTART,
    Policy,
    Reason,
)

Severity = Literal["info", "warning", "critical"]
MAX_RESTARTS = 1000


def _known_kinds(kinds, what: str) -> None:
    unknown = sorted(set(kinds) - set(FINDING_KINDS))
    if unknown:
        raise ValueError(f"unknown finding kind {unknown[0]!r} in {what}; expected one of "
                         f"{', '.join(FINDING_KINDS)}")



def _default_restart_on() -> dict[str, Severity]:
    # policy.default_restart_on's values are the kinds' restarts_at, each a Severity; its
    # signature says str.
    return cast(dict[str, Severity], default_restart_on())


class SuperviseConfig(BaseModel):
    """When ``healthsvc supervise`` restarts a run, and how often (docs/supervise.md)."""
    model_config = ConfigDict(extra="forbid")
    restart_on: dict[str, Severity] = Field(
        default_factory=_default_restart_on,
        description="Finding kinds that restart the job, each with the lowest severity that does "
                    "(info | warning | critical). A kind left out never restarts (its findings are "
                    "left to people); resume_mismatch cannot be listed (it stops the job: a restart "
                    "runs the same restore code). Default: " +
                    ", ".join(f"{k} >= {v}" for k, v in default_restart_on().items()) + ".")
    leave_out_kinds: list[str] = Field(
        default_factory=lambda: sorted(default_leave_out_kinds()), max_length=len(FINDING_KINDS),
        description="Kinds whose blamed hosts a restart leaves out (their ranks point at the "
                    "machine). Default: " + ", ".join(sorted(default_leave_out_kinds())) + ".")
    max_restarts: int = Field(3, ge=0, le=MAX_RESTARTS, strict=True,
                              description="Supervised restarts (for findings and crashes alike) "
                                          "before the answer is stop, count.")
    cooldown_s: Seconds = Field(60.0, description="Least time between two supervised restarts, "
                                                  "seconds; a restart asked for sooner is held "
                                                  "(continue, cooling_down).")
    restart_on_crash: bool = Field(True, description="Restart a job that exited non-zero with no "
                                                     "finding to explain it (as torchrun's "
                                                     "--max-restarts would), within the budget.")

    @field_validator("restart_on")
    @classmethod
    def _restartable(cls, value: dict[str, str]) -> dict[str, str]:
        _known_kinds(value, "restart_on")
        never = sorted(set(value) & NEVER_RESTART)
        if never:
            raise ValueError(f"{never[0]} cannot restart a job: the restore code did not continue "
                             "the run, and a restart runs it again (it stops the job instead)")
        return value

    @field_validator("leave_out_kinds")
    @classmethod
    def _leave_out(cls, value: list[str]) -> list[str]:
        _known_kinds(value, "leave_out_kinds")
        return sorted(set(value))

    def policy(self) -> Policy:
        return Policy(restart_on=dict(self.restart_on), leave_out_kinds=frozenset(self.leave_out_kinds),
                      max_restarts=self.max_restarts, cooldown_s=self.cooldown_s,
                      restart_on_crash=self.restart_on_crash)


class ActionCheckpoint(BaseModel):
    """The checkpoint to restart from: the rollback answer's (GET /v1/runs/{run_id}/rollback)."""
    step: int = Field(..., description="Step whose update the checkpoint includes (the state after "
                                       "it), steps; the job resumes at step + 1.")
    uri: str = Field(..., description="Where it lives, as the trainer reported it; what "
                                      "{checkpoint} becomes in the supervised command.")
    id: int | None = Field(..., description="Stored checkpoint id.")
    proven_clean: bool = Field(..., description="True when it is clean by proof (the replicas' "
                                                "digests agreed at or after it, or a probe verified "
                                                "it), not by the onset estimate.")


class WorldSize(BaseModel):
    """The job's size before and after the restart."""
    old: int | None = Field(..., description="Ranks now (the last world_size_change, else the "
                                             "configured world size, else the ranks seen), count; "
                                             "null when unknown.")
    new: int | None = Field(..., description="Ranks once the left-out hosts' ranks are gone, count; "
                                             "null when unknown.")
    changes: bool = Field(..., description="True when `new` differs from `old` (record a "
                                           "world_size_change event: the effective batch changes).")
    ranks_by_host: dict[str, list[int]] = Field(..., description="The ranks of each left-out host "
                                                                 "(so a host that passes a health "
                                                                 "check can be taken back).")


class ActionFinding(BaseModel):
    """A finding the decision rests on."""
    id: int = Field(..., description="Stored finding id (GET /v1/runs/{run_id}/findings).")
    kind: str = Field(..., description="Finding kind: " + ", ".join(FINDING_KINDS) + ".")
    severity: Severity = Field(..., description="info | warning | critical.")
    step: int = Field(..., description="First step that shows it, steps.")
    ranks: list[int] = Field(..., description="Ranks it blames; empty when run-wide.")
    hosts: list[str | None] = Field(..., description="Host of each blamed rank, null where unknown.")


class RestartEventData(BaseModel):
    """What a supervised restart records (the service reads it back for the budget, the cool-down
    and the loop check)."""
    model_config = ConfigDict(extra="allow")
    decided_by: str = Field(..., description="Who decided: \"healthsvc supervise\".")
    reason: str = Field(..., description="The decision's one-sentence reason.")
    reason_code: Reason = Field(..., description="The decision's named reason (finding or crash).")
    resume_from_checkpoint_step: int = Field(..., description="The checkpoint resumed from, steps.")
    uri: str = Field(..., description="Its URI.")
    causes: list[list] = Field(..., description="[kind, step] of each finding that caused it.")
    finding_ids: list[int] = Field(..., description="Their stored ids.")
    exclude_hosts: list[str] = Field(..., description="Hosts left out (a supervisor removes the "
                                                      "ones that passed its health check).")
    world_size: dict[str, int | None] = Field(..., description="{old, new}: ranks before and "
                                                               "after, count.")
    from_attempt: int = Field(..., description="The attempt that was stopped.")


class RestartEvent(BaseModel):
    """An event body for POST /v1/runs/{run_id}/events."""
    kind: Literal["rollback", "restart"] = Field(
        ..., description="rollback when a cause is a corruption kind (the economics count the work "
                         "lost to it), restart otherwise (a hang, a crash).")
    step: int = Field(..., description="The checkpoint step resumed from, steps.")
    data: RestartEventData = Field(..., description="The decision, for the timeline.")


class ActionOut(BaseModel):
    """What a supervisor should do now, and why."""
    run_id: str = Field(..., description="The run.")
    action: Literal["continue", "restart", "stop"] = Field(
        ..., description="continue = leave the job running; restart = stop it and start it again "
                         "from `checkpoint` without `exclude_hosts`; stop = stop it for good (a "
                         "restart would not help).")
    reason: Reason = Field(..., description="The named rule that decided (docs/supervise.md): " +
                                            ", ".join(r.value for r in Reason) + ".")
    message: str = Field(..., description="The reason in one sentence, for the terminal and the "
                                          "timeline.")
    checkpoint: ActionCheckpoint | None = Field(..., description="Where to restart from; set only "
                                                                 "with restart.")
    exclude_hosts: list[str] = Field(..., description="Hosts to leave out of the restarted job "
                                                      "(blamed by a cause of a leave_out_kinds "
                                                      "kind); what {exclude_hosts} becomes, comma-"
                                                      "separated.")
    world_size: WorldSize | None = Field(..., description="Old and new size of the job; set only "
                                                          "with restart.")
    findings: list[ActionFinding] = Field(..., description="The findings that caused the decision "
                                                           "(empty for continue, and for a crash).")
    restarts_used: int = Field(..., description="Supervised restarts recorded for this run so far, "
                                                "count.")
    max_restarts: int = Field(..., description="The run's restart budget, count.")
    retry_after_s: float | None = Field(..., description="With cooling_down: when to ask again, "
                                                         "seconds; null otherwise.")
    attempt: int = Field(..., description="The run's current attempt (0 before any metrics).")
    event: RestartEvent | None = Field(..., description="With restart: the event to post (POST "
                                                        "/v1/runs/{run_id}/events) once the job is "
                                                        "started again, so the timeline, the "
                                                        "budget and the cool-down see it.")
