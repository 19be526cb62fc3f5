"""Response schemas of the run-economics endpoints (timeline, advice, retention, goodput).

The handlers return the ``to_dict()`` of the pure results in :mod:`healthsvc_detectors.offline.economics`; these
models describe those dicts field by field, with units, and FastAPI validates each answer against
them. They must not change a value: numbers that may be integers or floats are typed
:data:`Number` (validation keeps the int or the float it is given), and every key is a field.

Units: times are the service's clock — a moment is unix seconds (``at_s``, ``written_at_s``,
``detected_at_s``), a duration is seconds (``*_s``); steps are optimizer-update indices; sizes are
bytes; overheads and goodput are fractions of wall time. The formulas are in docs/economics.md.

Example: ``GoodputOut.model_validate({"run_id": "r", **compute_goodput(attempts).to_dict()})``.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, WithJsonSchema

# A JSON number that stays an int when it is one (a plain ``float`` field would turn 0 into 0.0).
Number = Annotated[Union[int, float], WithJsonSchema({"type": "number"})]

_AT_S = "When it happened on the service's clock, unix seconds."
_ATTEMPT = ("Attempt running at that time (as in GET /v1/runs/{run_id} `attempts`); null before "
            "the first.")


# ----------------------------------------------------------------------------- timeline

class AttemptStartedEntry(BaseModel):
    """An attempt began (the first one, or a restart)."""
    kind: Literal["attempt_started"] = Field(..., description="Entry kind.")
    at_s: Number = Field(..., description="First metrics push of the attempt, unix seconds.")
    step: int = Field(..., description="First step of the attempt, steps.")
    attempt: int = Field(..., description="The attempt.")
    world_size: int | None = Field(..., description="Ranks in the attempt, count: the world_size the "
                                                    "ranks reported, else how many ranks pushed.")
    effective_batch_size: int | None = Field(..., description="world_size x per-rank batch size, "
                                                              "samples; null when the per-rank batch "
                                                              "size is not configured.")
    is_restart: bool = Field(..., description="True for every attempt after the first.")
    resumed_from_step: int | None = Field(..., description="For a restart: the step before the "
                                                           "attempt's first one (the checkpoint it "
                                                           "resumed from), steps; else null.")
    downtime_s: Number | None = Field(..., description="Time since the previous attempt's last push, "
                                                       "seconds; null for the first attempt.")


class AttemptEndedEntry(BaseModel):
    """An attempt's last metrics push (so far, for the running one)."""
    kind: Literal["attempt_ended"] = Field(..., description="Entry kind.")
    at_s: Number = Field(..., description="Last metrics push of the attempt, unix seconds.")
    step: int = Field(..., description="Last step of the attempt, steps.")
    attempt: int = Field(..., description="The attempt.")
    steps: int = Field(..., description="Steps the attempt ran (last - first + 1), count.")


class WorldSizeChangeEntry(BaseModel):
    """The number of ranks changed (an elastic leave or join, or a restart with fewer ranks)."""
    kind: Literal["world_size_change"] = Field(..., description="Entry kind.")
    at_s: Number = Field(..., description=_AT_S)
    step: int | None = Field(..., description="Step at the change (the trainer's event step, or the "
                                              "attempt's first step when detected), steps.")
    attempt: int | None = Field(..., description=_ATTEMPT)
    old_world_size: int | None = Field(..., description="Ranks before, count; null when unknown.")
    new_world_size: int | None = Field(..., description="Ranks after, count; null when unknown.")
    old_effective_batch_size: int | None = Field(..., description="Effective batch before, samples; "
                                                                  "null when unknown.")
    new_effective_batch_size: int | None = Field(..., description="Effective batch after, samples; "
                                                                  "null when unknown.")
    source: Literal["event", "detected"] = Field(
        ..., description="event = the trainer said so; detected = the ranks that pushed show it and "
                         "no event did.")
    ranks_lost: list[int] = Field(..., description="Ranks that stopped pushing (detected changes only).")
    ranks_added: list[int] = Field(..., description="Ranks that started pushing (detected changes only).")


class CheckpointTimelineEntry(BaseModel):
    """A checkpoint the trainer registered (deleted ones are left out)."""
    kind: Literal["checkpoint"] = Field(..., description="Entry kind.")
    at_s: Number = Field(..., description="When the service recorded it, unix seconds.")
    step: int = Field(..., description="Step whose update it includes, steps.")
    attempt: int | None = Field(..., description="Attempt that wrote it.")
    uri: str = Field(..., description="Where the checkpoint lives.")
    duration_s: Number | None = Field(..., description="Time the training was blocked writing it, "
                                                       "seconds; null when not reported.")
    size_bytes: int | None = Field(..., description="Its size, bytes; null when not reported.")


class FindingTimelineEntry(BaseModel):
    """A finding the detectors stored."""
    kind: Literal["finding"] = Field(..., description="Entry kind.")
    at_s: Number = Field(..., description="When the service stored the finding, unix seconds.")
    step: int = Field(..., description="First step that shows it (resolved: the step it cleared at), steps.")
    attempt: int | None = Field(..., description=_ATTEMPT)
    finding_kind: str = Field(..., description="The finding's kind (non_finite, loss_spike, straggler, "
                                               "hang, ...): also the alert name.")
    severity: Literal["info", "warning", "critical"] = Field(..., description="info | warning | critical.")
    status: Literal["firing", "resolved"] = Field(..., description="firing = started; resolved = cleared.")
    metric: str | None = Field(..., description="The metric it was seen in, when it concerns one.")
    ranks: list[int] = Field(..., description="Ranks it blames; empty when run-wide.")
    onset_step: int | None = Field(..., description="Estimated step the problem began, steps; null "
                                                    "when not estimated.")
    score: Number = Field(..., description="Unitless strength in [0, 1].")


class IncidentTimelineEntry(BaseModel):
    """A grouped problem: one per occurrence (what the MTBF counts)."""
    kind: Literal["incident"] = Field(..., description="Entry kind.")
    at_s: Number = Field(..., description=_AT_S)
    step: int | None = Field(..., description="Step at which it was detected, steps.")
    attempt: int | None = Field(..., description=_ATTEMPT)
    incident_kind: Literal["restart", "stall", "hang", "non_finite", "corruption", "other"] = Field(
        ..., description="restart, stall, non_finite and corruption count as failures for the MTBF.")
    onset_step: int | None = Field(..., description="First step the problem affected when known "
                                                    "(corruption: the first corrupted update), steps.")
    summary: str = Field(..., description="One line for people.")


class CauseOut(BaseModel):
    kind: str = Field(..., description="The finding's kind.")
    step: int = Field(..., description="The finding's step, steps.")


class DecisionOut(BaseModel):
    """A supervised restart: who decided it, from which checkpoint, and what it changed."""
    decided_by: str = Field(..., description="Who decided: \"healthsvc supervise\" for the supervisor.")
    reason_code: str | None = Field(..., description="The action answer's reason: finding, crash, ...")
    from_attempt: int | None = Field(..., description="The attempt that was stopped; the restart "
                                                      "opens the next one.")
    checkpoint_step: int | None = Field(..., description="The checkpoint resumed from, steps.")
    checkpoint_uri: str | None = Field(..., description="The checkpoint's URI, as the trainer reported it.")
    exclude_hosts: list[str] = Field(..., description="The hosts left out (after their health checks).")
    old_world_size: int | None = Field(..., description="Ranks before the restart.")
    new_world_size: int | None = Field(..., description="Ranks after it (fewer when hosts are left out).")
    causes: list[CauseOut] = Field(..., description="The findings that caused it.")


class EventTimelineEntry(BaseModel):
    """Another event the trainer sent (restart, rollback, config_change, note)."""
    kind: Literal["event"] = Field(..., description="Entry kind.")
    at_s: Number = Field(..., description="When the service recorded the event, unix seconds.")
    step: int | None = Field(..., description="The event's step (rollback: the checkpoint step resumed "
                                              "from), steps.")
    attempt: int | None = Field(..., description=_ATTEMPT)
    event_kind: str = Field(..., description="The trainer's event kind: restart, rollback, "
                                             "config_change or note.")
    reason: str | None = Field(..., description="The event's `data.reason`, when it sent one.")
    decision: DecisionOut | None = Field(None, description="A supervised restart's record "
                                                          "(docs/supervise.md), else null.")


TimelineEntry = Annotated[
    Union[AttemptStartedEntry, AttemptEndedEntry, WorldSizeChangeEntry, CheckpointTimelineEntry,
          FindingTimelineEntry, IncidentTimelineEntry, EventTimelineEntry],
    Field(discriminator="kind")]


class TimelineOut(BaseModel):
    """The run's history in time order."""
    run_id: str = Field(..., description="The run.")
    attempts: int = Field(..., description="Attempts so far, count.")
    restarts: int = Field(..., description="Attempts after the first, count.")
    world_size_changes: int = Field(..., description="world_size_change entries, count.")
    entries: list[TimelineEntry] = Field(..., description="Entries by time; at equal times attempt "
                                                          "starts first and attempt ends last. "
                                                          "`kind` says which fields an entry has.")
    truncated: bool = Field(False, description="Present (true) only when `limit` cut older entries.")


# ----------------------------------------------------------------------------- advice

class MtbfPriorOut(BaseModel):
    """The prior belief about the MTBF."""
    mtbf_s: Number = Field(..., description="Prior mean time between failures, seconds.")
    pseudo_failures: Number = Field(..., description="Weight of the prior, failures (may be fractional).")
    source: str = Field(..., description="request (the `prior_mtbf_s` query parameter), organisation "
                                         "(other runs' pooled restarts) or default (8 h).")


class MtbfOut(BaseModel):
    """The MTBF used for the advice: (alpha * prior + T) / (alpha + n)."""
    mtbf_s: Number = Field(..., description="Mean time between failures used, seconds.")
    source: Literal["prior", "blended", "observed"] = Field(
        ..., description="prior = no failure seen yet; observed = the prior weighs at most 0.2; "
                         "blended otherwise.")
    failures: int = Field(..., description="Failures observed in this run (incidents merged within "
                                           "10 min), count.")
    exposure_s: Number = Field(..., description="Run time over which failures were observed (summed "
                                                "attempt spans), seconds.")
    observed_mtbf_s: Number | None = Field(..., description="exposure_s / failures, seconds; null "
                                                            "before the first failure.")
    prior_weight: Number = Field(..., description="Share of the estimate that is still the prior, "
                                                  "fraction in (0, 1].")
    prior: MtbfPriorOut = Field(..., description="The prior.")


class OverheadOut(BaseModel):
    """Expected overhead under Daly's model: share of wall time not spent on useful work."""
    young: Number | None = Field(..., description="At Young's interval, fraction in [0, 1); null "
                                                  "when C is unknown.")
    daly: Number | None = Field(..., description="At Daly's interval, fraction in [0, 1); null when "
                                                 "C is unknown.")
    current: Number | None = Field(..., description="At the current interval, fraction in [0, 1); "
                                                    "null when C or the current interval is unknown.")


class AdviceOut(BaseModel):
    """Checkpoint interval advice for the run."""
    run_id: str = Field(..., description="The run.")
    checkpoint_cost_s: Number | None = Field(..., description="C: mean checkpoint write duration, "
                                                              "seconds; null when none was reported.")
    checkpoints_observed: int = Field(..., description="Checkpoints with a reported duration, count.")
    restart_cost_s: Number = Field(..., description="R: mean restart downtime, seconds (see "
                                                    "`restart_cost_source`).")
    restart_cost_source: Literal["observed", "assumed_equal_to_checkpoint_cost", "none"] = Field(
        ..., description="observed = from the run's restarts; assumed_equal_to_checkpoint_cost = no "
                         "restart yet, R = C; none = neither known, R = 0.")
    mtbf: MtbfOut = Field(..., description="M: the mean time between failures used.")
    young_interval_s: Number | None = Field(..., description="Young's optimum sqrt(2CM), compute "
                                                             "seconds between checkpoints; null when "
                                                             "C is unknown.")
    daly_interval_s: Number | None = Field(..., description="Daly's higher-order optimum, compute "
                                                            "seconds between checkpoints; null when "
                                                            "C is unknown.")
    step_time_s: Number | None = Field(..., description="Typical (median) step time of the newest "
                                                        "attempt that has one, seconds; null when "
                                                        "no step_time was reported.")
    current_interval_steps: Number | None = Field(..., description="Median gap between consecutive "
                                                                   "checkpoints, steps; null with "
                                                                   "fewer than two.")
    current_interval_s: Number | None = Field(..., description="current_interval_steps x "
                                                               "step_time_s, seconds; null when "
                                                               "either is unknown.")
    recommended_interval_steps: int | None = Field(..., description="Daly's interval in steps "
                                                                    "(rounded, at least 1); null "
                                                                    "when C or the step time is "
                                                                    "unknown.")
    overhead: OverheadOut = Field(..., description="Expected overhead at each interval, fractions "
                                                   "of wall time.")
    current_to_optimum_ratio: Number | None = Field(..., description="current_interval_s / "
                                                                     "daly_interval_s, unitless; "
                                                                     "null when either is unknown.")
    warning: str | None = Field(..., description="Set when the ratio is above `warn_ratio` or below "
                                                 "its inverse: what to change, in words.")


# ----------------------------------------------------------------------------- retention

class RetentionPolicyOut(BaseModel):
    """The policy the plan applied (the query parameters, defaults filled in)."""
    keep_recent: int = Field(..., description="Newest checkpoints kept densely, count.")
    sparse_base: Number = Field(..., description="Older checkpoints: one per age bucket growing by "
                                                 "this factor, unitless (> 1).")
    sparse_unit_steps: int | None = Field(..., description="Age unit of the buckets, steps; null = "
                                                           "the median checkpoint gap.")
    max_count: int | None = Field(..., description="Budget: checkpoints kept at most, count; null = "
                                                   "unlimited.")
    max_bytes: int | None = Field(..., description="Budget: bytes kept at most; null = unlimited.")
    lag_margin_factor: Number = Field(..., description="Multiplier on the longest detection lag "
                                                       "seen, unitless (>= 1).")
    min_lag_window_steps: int = Field(..., description="Smallest lag window, steps.")


class RetentionCheckpointOut(BaseModel):
    """The plan for one checkpoint."""
    step: int = Field(..., description="Step whose update it includes, steps.")
    uri: str = Field(..., description="Where the checkpoint lives.")
    size_bytes: int | None = Field(..., description="Its size, bytes; null when not reported (then "
                                                    "budgeted as the median known size).")
    written_at_s: Number = Field(..., description="When the service recorded it, unix seconds.")
    action: Literal["keep", "delete"] = Field(..., description="keep, or delete (may be deleted; "
                                                               "nothing is deleted by the service).")
    reasons: list[str] = Field(..., description="Why: rollback_target, newest_verified_clean, "
                                                "lag_coverage, lag_coverage_oldest_available "
                                                "(guarantees), recent, sparse_spacing, over_budget, "
                                                "thinned, known_corrupted.")


class CorruptionOut(BaseModel):
    """A detected silent corruption (rank_outlier finding with an onset, or a rollback event)."""
    onset_step: int = Field(..., description="First corrupted update (earliest estimate), steps.")
    detected_step: int = Field(..., description="Step at which it was detected, steps.")
    detected_at_s: Number = Field(..., description="When it was detected, unix seconds.")
    lag_steps: int = Field(..., description="Detection lag: detected_step - onset_step, steps.")
    rollback_target_step: int | None = Field(..., description="Checkpoint the run was told (or "
                                                              "chose) to resume from, steps; null "
                                                              "when none was clean.")


class RetentionOut(BaseModel):
    """Which checkpoints to keep and which may be deleted: a plan, never a deletion."""
    run_id: str = Field(..., description="The run.")
    policy: RetentionPolicyOut = Field(..., description="The policy applied.")
    current_step: int = Field(..., description="Last step of the newest attempt, steps.")
    lag_window_steps: int = Field(..., description="History to keep behind the current step to roll "
                                                   "back past a corruption not detected yet: the "
                                                   "longest lag x lag_margin_factor, at least "
                                                   "min_lag_window_steps, steps.")
    kept_count: int = Field(..., description="Checkpoints kept, count.")
    kept_bytes: int = Field(..., description="Their size, bytes (unknown sizes counted as the median "
                                             "known size).")
    deletable_bytes: int = Field(..., description="Size of the checkpoints that may be deleted, bytes.")
    over_budget: bool = Field(..., description="True when the guarantees alone break `max_count` or "
                                               "`max_bytes` (guarantees win).")
    checkpoints: list[RetentionCheckpointOut] = Field(..., description="One decision per checkpoint, "
                                                                       "in write order (oldest first).")
    corruptions: list[CorruptionOut] = Field(..., description="The corruptions the plan accounted "
                                                              "for (they set the lag window).")


# ----------------------------------------------------------------------------- goodput

class GoodputOut(BaseModel):
    """Wall time split by use (first attempt's start to last attempt's end), and steps alongside."""
    run_id: str = Field(..., description="The run.")
    wall_s: Number = Field(..., description="First push of the first attempt to last push of the last, "
                                            "seconds.")
    productive_s: Number = Field(..., description="Steps that survive (no later attempt redid them) x "
                                                  "their attempt's step time, seconds.")
    checkpoint_s: Number = Field(..., description="Sum of checkpoint write durations, seconds.")
    downtime_s: Number = Field(..., description="Gaps between an attempt's end and the next one's "
                                                "start (restarts), seconds.")
    recompute_s: Number = Field(..., description="Steps computed again by a later attempt that "
                                                 "resumed from an earlier checkpoint, seconds.")
    corrupted_progress_s: Number = Field(..., description="Thrown-away steps computed at or after a "
                                                          "corruption's onset (progress the rollback "
                                                          "discards), seconds.")
    unaccounted_s: Number = Field(..., description="The residual (idle, input stalls, step time "
                                                   "noise), seconds; may be slightly negative.")
    goodput_fraction: Number = Field(..., description="productive_s / wall_s, fraction in [0, 1]; 0 "
                                                      "for an empty run.")
    productive_steps: int = Field(..., description="Steps that survive, count.")
    recomputed_steps: int = Field(..., description="Steps computed again, count.")
    corrupted_steps: int = Field(..., description="Steps thrown away because they ran on corrupted "
                                                  "weights, count.")

