"""Request and response schemas of the rollback and bisection endpoints (the OpenAPI contract).

The handlers build plain dicts (``RollbackAnswer.to_dict``, ``service.bisection_status``); these
models describe them field by field, with units, and FastAPI validates each answer against them.
They must not change a value: numbers that may be either integers or floats are typed
:data:`Number` (validation keeps the int or the float it is given), and every key a handler returns
is a field, so nothing is dropped.

Steps are optimizer-update indices as on the wire (``healthsvc_client.wire``); a checkpoint at step ``c``
holds the state after the update of step ``c``, so it is clean only if ``c`` is before the first
corrupted update (docs/rollback.md).

Example: ``RollbackOut.model_validate(decide(ctx, "run-1").to_dict("run-1"))``.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from healthsvc.limits import FiniteFloat, NonNegInt

# A JSON number that stays an int when it is one (a plain ``float`` field would turn 0 into 0.0).
Number = Annotated[Union[int, float], WithJsonSchema({"type": "number"})]

_STEP = "Optimizer-update index, steps."


# ----------------------------------------------------------------------------- requests

class BisectionStartIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: list[NonNegInt] | None = Field(
        None, max_length=100_000,
        description="Checkpoint steps to bisect (each must be a stored checkpoint's step), steps. "
                    "Default: the checkpoints inside the onset interval, widened to the rollback "
                    "target and the first checkpoint after the interval.")
    known_good: NonNegInt | None = Field(
        None, description="A step known clean, steps: listed checkpoints at or before it count as good.")
    known_bad: NonNegInt | None = Field(
        None, description="A step known corrupted, steps: listed checkpoints at or after it count as bad.")


class ProbeReportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: NonNegInt = Field(..., description="The probed checkpoint's step (the proposed probe, "
                                             "`next_probe.step`), steps.")
    good: bool = Field(..., description="True when the checkpoint holds no corrupted update.")
    value: FiniteFloat | None = Field(
        None, description="The probe's own number, in the probe's unit (say, the loss of a fixed "
                          "batch, unitless); kept with the report and in the checkpoint's note.")


# ----------------------------------------------------------------------------- findings

_FINDING = {
    "kind": "Finding kind: non_finite, loss_spike, grad_spike, rank_outlier or divergence (the kinds "
            "that mean an update may be corrupted).",
    "step": "First step that shows it, steps.",
    "ranks": "Ranks it blames; empty when run-wide.",
    "severity": "How bad: info | warning | critical.",
    "score": "Unitless strength in [0, 1]: 0 = barely past the detector's threshold, 1 = as bad as "
             "it can say.",
    "metric": "The metric it was seen in (e.g. loss, grad_norm), when it concerns one.",
    "status": "firing = the condition started; resolved = it cleared at `step`.",
    "onset_step": "The detector's estimate of the step the problem began, when earlier than `step`, "
                  "steps.",
    "evidence": "The numbers behind the decision (free-form, per detector; see "
                "docs/detectors-values.md).",
}
Severity = Literal["info", "warning", "critical"]
Status = Literal["firing", "resolved"]


class IncidentFinding(BaseModel):
    """A corruption finding of the incident, as the detector reported it (``Finding.to_dict``)."""
    kind: str = Field(..., description=_FINDING["kind"])
    step: int = Field(..., description=_FINDING["step"])
    ranks: list[int] = Field(..., description=_FINDING["ranks"])
    severity: Severity = Field(..., description=_FINDING["severity"])
    score: Number = Field(..., description=_FINDING["score"])
    metric: str | None = Field(..., description=_FINDING["metric"])
    status: Status = Field(..., description=_FINDING["status"])
    onset_step: int | None = Field(..., description=_FINDING["onset_step"])
    evidence: dict[str, Any] = Field(..., description=_FINDING["evidence"])


class RollbackFinding(BaseModel):
    """An incident finding with its stored identity (keys in the order the service writes them)."""
    id: int = Field(..., description="Stored finding id (as in GET /v1/runs/{run_id}/findings).")
    attempt: int = Field(..., description="Attempt in which it was found (always the current one).")
    kind: str = Field(..., description=_FINDING["kind"])
    step: int = Field(..., description=_FINDING["step"])
    ranks: list[int] = Field(..., description=_FINDING["ranks"])
    severity: Severity = Field(..., description=_FINDING["severity"])
    score: Number = Field(..., description=_FINDING["score"])
    metric: str | None = Field(..., description=_FINDING["metric"])
    status: Status = Field(..., description=_FINDING["status"])
    onset_step: int | None = Field(..., description=_FINDING["onset_step"])
    evidence: dict[str, Any] = Field(..., description=_FINDING["evidence"])


# ----------------------------------------------------------------------------- rollback

class RollbackCheckpoint(BaseModel):
    """The checkpoint to resume from."""
    step: int = Field(..., description="Step whose update the checkpoint includes (the state after "
                                       "that step's update), steps.")
    uri: str = Field(..., description="Where the checkpoint lives, as the trainer reported it.")
    status: Literal["ok", "deleted", "verified"] = Field(
        ..., description="ok = reported, not probed; verified = a probe (or a person) found it "
                         "clean; deleted = no longer available (never recommended).")
    verdict: Literal["good", "bad"] | None = Field(
        ..., description="A probe's verdict on it, when there was one (bisection or a checkpoint "
                          "marked `bad`); null otherwise.")
    id: int | None = Field(..., description="Stored checkpoint id (for PATCH "
                                             "/v1/runs/{run_id}/checkpoints/{id}).")


class SignalOnset(BaseModel):
    """One signal's view of the first corrupted update."""
    signal: str = Field(..., description="non_finite, loss_trend, grad_norm, rank_disagreement, findings, "
                                                 "or param_digest (the replicas' digests: an exact interval).")
    step: int = Field(..., description="This signal's estimate of the first corrupted update, steps.")
    low: int = Field(..., description="Earliest step the first corrupted update may be, steps (inclusive).")
    high: int = Field(..., description="Latest step the first corrupted update may be, steps (inclusive).")
    shape: Literal["abrupt", "gradual"] = Field(
        ..., description="abrupt = a level shift or a spike; gradual = a drift (a hinge in the trend).")
    score: Number = Field(..., description="Unitless, in [0, 1): 0 at the significance threshold, "
                                           "towards 1 as the evidence grows; rounded to 4 decimals.")
    ranks: list[int] = Field(..., description="Ranks this signal blames; empty when run-wide.")
    detail: dict[str, Any] = Field(..., description="The signal's own numbers (free-form: e.g. metric, "
                                                    "first_step, lag_steps, rank_score, finding_steps).")


class Onset(BaseModel):
    """The estimate of the first corrupted update (``healthsvc_detectors.offline.onset.OnsetEstimate``)."""
    step: int = Field(..., description="Point estimate of the first corrupted update, steps.")
    low: int = Field(..., description="Earliest step it may be, steps (inclusive).")
    high: int = Field(..., description="Latest step it may be, steps (inclusive).")
    confidence: Number = Field(..., description="Heuristic in [0, 1] (not a calibrated probability): "
                                                "the strongest signal's score times the share of "
                                                "signals that agree with `step`; rounded to 4 decimals.")
    signals_used: list[str] = Field(..., description="The signals the estimate rests on, in a fixed "
                                                     "order (keys of `per_signal`).")
    shape: Literal["abrupt", "gradual"] = Field(..., description="Shape of the earliest signal's change: "
                                                                 "abrupt (shift, spike) or gradual (drift).")
    origin: Literal["data", "hardware", "unknown"] = Field(
        ..., description="data = every rank changed at once; hardware = one rank disagrees with its "
                         "peers (`ranks`); unknown otherwise.")
    ranks: list[int] = Field(..., description="Ranks blamed when `origin` is hardware; else empty.")
    spike_end: int | None = Field(..., description="Last step of the abrupt excursion that began at "
                                                    "`step` (batches to skip), steps; null when not abrupt.")
    per_signal: dict[str, SignalOnset] = Field(..., description="Each signal's own estimate, by signal name.")


class EvidenceEpisode(BaseModel):
    """One corruption-kind condition from its first firing finding to its resolution, and whether
    the decision counted it as evidence."""
    kind: str = Field(..., description="Finding kind.")
    metric: str | None = Field(..., description="Metric the findings are about.")
    ranks: list[int] = Field(..., description="Ranks blamed (empty: run-wide).")
    onset: int = Field(..., description="Earliest onset_step (else step) of its findings, steps.")
    first_step: int = Field(..., description="Step of its first firing finding (its detection), steps.")
    severity: Literal["info", "warning", "critical"] = Field(..., description="Highest severity reached.")
    resolved_step: int | None = Field(..., description="Step of the resolved finding that cleared it; "
                                                       "null while firing.")
    resolved_reason: str | None = Field(..., description="Why it resolved, as its detector said.")
    evidence: bool = Field(..., description="True when it counts as evidence of corruption: warning or "
                                            "critical, and not a transient that recovered within "
                                            "50 steps of its onset (a divergence, and anything in "
                                            "the first 5 steps after a restart, always counts).")
    why: str = Field(..., description="Why it counts or not, for people.")
    window: Literal["abrupt", "drift"] = Field(..., description=(
        "The onset window it took: its kind's corruption shape (abrupt: 32 steps or twice the "
        "detection delay before its onset; drift: 256 steps or four times it), abrupt for a "
        "drift kind whose rise began with a jump (`jump_step`)."))
    jump_step: int | None = Field(..., description=(
        "For a drift kind (divergence, rank_outlier): the step at which the run's loss jumped, "
        "within 8 steps after the episode's onset, when the history shows such a jump; null "
        "when the rise was gradual."))


class ReplicaProofOut(BaseModel):
    """What the replicas' digests prove about the onset."""
    last_agreeing_step: int = Field(..., description="Newest step at which every replica of the group "
                                                     "reported the same parameter digest, steps.")
    first_disagreeing_step: int = Field(..., description="First step at which they disagreed, steps.")
    ranks: list[int] = Field(..., description="The ranks whose digest differed from the majority.")


class RollbackEvidence(BaseModel):
    """What the decision rests on, beyond the onset estimate."""
    corruption: bool = Field(..., description="True when an onset was estimated or a checkpoint was "
                                              "found bad by a probe.")
    first_verified_bad: int | None = Field(..., description="Oldest checkpoint a probe found bad, steps; "
                                                             "nothing at or after it is used.")
    verified_good: list[int] = Field(..., description="Checkpoints known good by a probe (and not "
                                                      "contradicted), steps.")
    contradicted_good: list[int] = Field(..., description="Checkpoints reported good after a bad one "
                                                          "(ignored: corruption does not heal), steps.")
    deleted_newer: list[int] = Field(..., description="Clean checkpoints newer than the chosen one that "
                                                      "are deleted, steps.")
    bisect_candidates: list[int] = Field(..., description="Checkpoints passed over only because the "
                                                          "onset interval is wide, steps; a bisection "
                                                          "can recover them.")
    origin: Literal["data", "hardware", "unknown", "none"] = Field(
        ..., description="Where the evidence points: data (skip batches), hardware (drain `ranks`), "
                         "unknown, or none (no onset).")
    ranks: list[int] = Field(..., description="Ranks blamed when `origin` is hardware; else empty.")
    findings: list[IncidentFinding] = Field(..., description="The incident's findings as the decision "
                                                             "saw them (same as the top-level "
                                                             "`findings`, without id and attempt).")
    newest_checkpoint: int | None = Field(..., description="Newest usable (not deleted) checkpoint, "
                                                            "steps; null when there is none.")
    superseded: list[int] = Field(..., description="Checkpoints written by an earlier attempt at or "
                                                   "after the step a later attempt resumed from (an "
                                                   "abandoned branch; never recommended), steps.")
    history_steps: int = Field(..., description="Steps of history the onset estimate looked at, "
                                                "count (0 when no estimate was needed).")
    episodes: list[EvidenceEpisode] = Field(default_factory=list, description=(
        "Every corruption-kind episode of the current attempt, oldest onset first, with whether "
        "it counted as evidence (info-only episodes and recovered transients do not)."))
    resumed_from: int | None = Field(None, description=(
        "Set when the corruption began within 5 steps of a restart: the checkpoint that restart "
        "resumed from, which is then the answer (the restore is to blame), steps."))
    restart_first_step: int | None = Field(None, description=(
        "The first step after that restart, steps; null unless `resumed_from` is set."))
    proof: ReplicaProofOut | None = Field(None, description=(
        "Set when a replica_mismatch dates the incident exactly: the replicas' parameter digests "
        "agreed at `last_agreeing_step` and disagreed at `first_disagreeing_step`, so the first "
        "corrupted update is in between (`onset` is that interval, confidence 1)."))
    proven_clean: bool = Field(False, description=(
        "True when the chosen checkpoint is clean by proof (at or before the replicas' last "
        "agreeing step, or verified good by a probe), not by an estimate."))


class RollbackOut(BaseModel):
    """Where to resume the run from, and why."""
    run_id: str = Field(..., description="The run.")
    checkpoint: RollbackCheckpoint | None = Field(
        ..., description="The newest checkpoint that holds no corrupted update; null when no usable "
                         "checkpoint precedes the corruption (restart from scratch).")
    onset: Onset | None = Field(..., description="The first corrupted update, estimated from the "
                                                 "history and the findings; null when no corruption "
                                                 "finding fired in the current attempt.")
    reason: str = Field(..., description="One paragraph for people: why this checkpoint (ending "
                                         "with `proof_note` when there is one).")
    fingerprints: bool = Field(False, description=(
        "True when the run sent replica fingerprints (`param_digest`, the client's "
        "`fingerprint()`): a corrupted replica is then caught by proof, however small."))
    proof: ReplicaProofOut | None = Field(None, description=(
        "The replicas' digests dating the incident exactly (as `evidence.proof`); null when no "
        "replica mismatch dates it, and always null for a run without fingerprints."))
    proof_note: str | None = Field(None, description=(
        "Without fingerprints: a sentence saying that silent corruption of a replica cannot be "
        "excluded and how to turn fingerprints on; null when the run sent them."))
    conservative: bool = Field(..., description="True when the onset interval made the decision pass "
                                                "over checkpoints that are probably clean "
                                                "(`evidence.bisect_candidates`).")
    skip_data_range: list[int] | None = Field(
        ..., min_length=2, max_length=2,
        description="Inclusive [first, last] steps whose batches to skip on replay, when the "
                    "evidence points at the data; null otherwise.")
    findings: list[RollbackFinding] = Field(..., description="Corruption findings of the current "
                                                             "attempt (firing or since resolved), "
                                                             "oldest onset first.")
    evidence: RollbackEvidence = Field(..., description="What the decision rests on.")
    proven_clean: bool = Field(False, description=(
        "True when the checkpoint is clean by proof, not by estimate: at or before the last step "
        "at which the replicas' parameter digests agreed (`evidence.proof`), or verified good by "
        "a probe."))


# ----------------------------------------------------------------------------- bisection

class NextProbe(BaseModel):
    """The checkpoint to probe next."""
    step: int = Field(..., description="Its step, steps.")
    uri: str | None = Field(..., description="Where it lives; null when the step is not a stored checkpoint.")
    id: int | None = Field(..., description="Stored checkpoint id; null when the step is not a stored checkpoint.")


class ProbeReportOut(BaseModel):
    """A probe verdict the bisection recorded."""
    step: int = Field(..., description="The probed checkpoint's step, steps.")
    good: bool = Field(..., description="True when it was found clean.")
    value: float | None = Field(..., description="The probe's own number as reported (probe's unit); "
                                                  "null when none was sent.")


class BisectionOut(BaseModel):
    """The state of a run's bisection over checkpoints."""
    run_id: str = Field(..., description="The run.")
    done: bool = Field(..., description="True when no checkpoint is left undecided: `last_good` is final.")
    next_probe: NextProbe | None = Field(..., description="The checkpoint to probe next; null when done.")
    last_good: int | None = Field(..., description="Newest step known good (a listed checkpoint, else "
                                                    "`known_good`), steps; the answer once done, the "
                                                    "best so far before; null when none is known.")
    first_bad: int | None = Field(..., description="Oldest step known bad (a listed checkpoint, else "
                                                    "`known_bad`), steps; null when none is known.")
    probes: int = Field(..., description="Probe reports that narrowed the search so far, count.")
    remaining_probes: int = Field(..., description="Worst-case probes still needed, count: "
                                                   "ceil(log2(undecided + 1)).")
    steps: list[int] = Field(..., description="The checkpoints being bisected, ascending, steps.")
    reports: list[ProbeReportOut] = Field(..., description="The probe reports that narrowed the "
                                                           "search, in order (repeats are not kept).")


class BisectionDeleted(BaseModel):
    ok: bool = Field(..., description="True: the bisection was abandoned (probe verdicts stay on the "
                                      "checkpoints).")
