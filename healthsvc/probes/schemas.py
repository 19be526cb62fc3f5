"""Request and response models of the replay probes (fields and units for the OpenAPI schema)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from healthsvc.limits import NonNegInt


class ProbeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    suspect_rank: NonNegInt | None = Field(None, description=(
        "The rank to probe. Omitted: the first rank blamed by `finding_id`."))
    healthy_rank: NonNegInt | None = Field(None, description=(
        "The rank to compare it with. Omitted: the lowest other rank that reported in the current "
        "attempt and is not blamed by the finding."))
    step: NonNegInt | None = Field(None, description=(
        "The step whose batch (the suspect's) both ranks replay. Omitted: the finding's step, else "
        "the run's newest step."))
    finding_id: NonNegInt | None = Field(None, description=(
        "A finding of the run (GET .../findings) that made the rank a suspect, e.g. a "
        "replica_mismatch or rank_outlier."))
    reason: str | None = Field(None, max_length=1000, description="Why, for the people reading the run later.")


class ProbeReportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: NonNegInt = Field(..., description="The reporting rank: the probe's suspect or healthy rank.")
    grad_norm: float = Field(..., description=(
        "The gradient L2 norm this rank recomputed on the probe's batch (unitless; NaN allowed)."))


class Probe(BaseModel):
    """A replay probe and, once both ranks reported, its verdict."""
    id: int = Field(..., description="The probe's id.")
    run_id: str = Field(..., description="The run.")
    status: Literal["pending", "done"] = Field(..., description="pending until both ranks reported, then done.")
    suspect_rank: int = Field(..., description="The rank under suspicion.")
    healthy_rank: int = Field(..., description="The rank it is compared with.")
    step: int = Field(..., description="The step whose batch (the suspect's) both ranks replay.")
    finding_id: int | None = Field(None, description="The finding that made the rank a suspect, if any.")
    reason: str | None = Field(None, description="Why the probe was asked for.")
    created_at: float = Field(..., description="When it was asked for, unix seconds (service clock).")
    reports: dict[str, float | str] = Field(..., description=(
        "Gradient norm reported per rank (keys are ranks), unitless; non-finite as \"NaN\"/\"Infinity\"."))
    verdict: Literal["data_or_code", "hardware"] | None = Field(None, description=(
        "data_or_code: both ranks computed the same norm on the same batch, so the suspect's "
        "hardware computes as its peer does (look at the data of that step, or the code); "
        "hardware: they differ, so the suspect's compute or the state in its memory is to blame. "
        "Null while pending."))
    host: str | None = Field(None, description="The suspect rank's host (the machine to drain on a hardware verdict).")
    explanation: str | None = Field(None, description="The verdict in one sentence for people; null while pending.")
