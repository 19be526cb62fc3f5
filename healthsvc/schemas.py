"""Request and response schemas of the v1 API (kept apart from domain objects).

The metrics ingest body is parsed by hand on the hot path (see ``healthsvc.ingest.parse``); its
models here document the contract in the OpenAPI schema and are what clients program against.
"""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from healthsvc.limits import INT64_MAX, check_storable, NonNegInt, PositiveInt, Seconds
from healthsvc.supervise.schemas import SuperviseConfig
from healthsvc_client.wire import EVENT_KINDS, HEARTBEAT_PHASES, INTEGER_FIELDS, KEY_FIELDS, METRIC_FIELDS, STRING_FIELDS

NonFinite = Literal["NaN", "Infinity", "-Infinity"]
# A metric value: a number, a non-finite token/string, or null for "not reported".
MetricValue = Union[float, NonFinite, None]

_record_fields: dict[str, Any] = {
    "step": (int, Field(..., ge=0, description=KEY_FIELDS["step"])),
    "rank": (int, Field(..., ge=0, description=KEY_FIELDS["rank"])),
}
_record_fields.update({name: (MetricValue, Field(None, description=desc + " NaN/Infinity allowed; null = not reported."))
                       for name, desc in METRIC_FIELDS.items() if name not in INTEGER_FIELDS})
_record_fields.update({name: (Union[int, None], Field(None, ge=0, le=2 ** 53, description=desc + " null = not reported."))
                       for name in INTEGER_FIELDS for desc in [METRIC_FIELDS[name]]})
_record_fields.update({name: (Union[str, None], Field(None, description=desc)) for name, desc in STRING_FIELDS.items()})

MetricRecord = create_model(
    "MetricRecord", __config__=ConfigDict(extra="allow", json_schema_extra={
        "description": "One rank's report for one step. Unknown numeric fields are kept as extra metrics."}),
    **_record_fields)

_column_fields: dict[str, Any] = {
    "step": (list[int], Field(..., description="Steps, one per record (integers >= 0).")),
    "rank": (list[int], Field(..., description="Ranks, one per record (integers >= 0).")),
}
_column_fields.update({name: (Union[list[MetricValue], None], Field(None, description=desc))
                       for name, desc in METRIC_FIELDS.items()})
_column_fields.update({name: (Union[list[Union[str, None]], None], Field(None, description=desc))
                       for name, desc in STRING_FIELDS.items()})
MetricColumns = create_model(
    "MetricColumns", __config__=ConfigDict(extra="allow", json_schema_extra={
        "description": "Equal-length lists, one entry per record (what a rank-0 aggregator or a replay sends)."}),
    **_column_fields)


class MetricsRows(BaseModel):
    records: list[MetricRecord] = Field(..., description="Per-rank step records.")  # type: ignore[valid-type]
    batch_id: str | None = Field(None, max_length=128,
                                 description="Idempotency key; a re-sent batch with the same id is not stored twice. "
                                             "Without it the body's hash is the key.")


class MetricsColumnar(BaseModel):
    columns: MetricColumns = Field(..., description="Columnar records.")  # type: ignore[valid-type]
    batch_id: str | None = Field(None, max_length=128, description="Idempotency key, as in the rows form.")


class ErrorItem(BaseModel):
    loc: list[str | int] = Field(..., description="Where the problem is: e.g. [\"body\", \"records\", 3, \"loss\"] "
                                                  "or [\"query\", \"ranks\"].")
    msg: str = Field(..., description="What is wrong, in words.")
    type: str = Field(..., description="Kind of error, e.g. invalid_input, payload_too_large, missing.")
    hint: str | None = Field(None, description="How to fix the call, when there is more to say.")


class ErrorBody(BaseModel):
    """The body of every 4xx answer."""
    detail: list[ErrorItem] = Field(..., description="One item per problem found.")


class Accepted(BaseModel):
    accepted: int = Field(..., description="Records accepted (durable) by this request.")
    duplicate: bool = Field(False, description="True when this batch had already been accepted; nothing was stored again.")
    attempt: int = Field(..., description="Attempt the records were stored under (a new one opens when steps go back).")


LEGACY_HANG_FLOOR = "hang_timeout_floor_s"


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    world_size: PositiveInt | None = Field(None, description="Number of ranks expected, count (at most max_ranks).")
    batch_size_per_rank: PositiveInt | None = Field(None, description="Samples per rank per step, count (effective batch = world_size x this).")
    # Renamed: one knob, one name (detectors.hang.timeout_floor_s). Kept only to refuse it with a
    # message that says where it went; configs stored before the rename are upgraded on read.
    hang_timeout_floor_s: Any = Field(None, exclude=True, json_schema_extra={"deprecated": True},
                                      description="Renamed: set detectors.hang.timeout_floor_s (seconds, the smallest "
                                                  "silence that counts as a hang). A value here is refused.")
    detectors: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                                 description="Per-detector parameters, by finding kind, e.g. {\"straggler\": {\"min_ratio\": 1.1}, \"hang\": {\"timeout_floor_s\": 120}}.")
    tags: dict[str, str] = Field(default_factory=dict, description="Free-form labels (team, model, cluster).")
    supervise: SuperviseConfig | None = Field(None, description="When `healthsvc supervise` restarts the run "
                                                                 "(GET /v1/runs/{run_id}/action); null: the defaults. "
                                                                 "See docs/supervise.md.")

    @field_validator("hang_timeout_floor_s")
    @classmethod
    def _renamed(cls, value: Any) -> None:
        if value is not None:
            raise ValueError("renamed: set detectors.hang.timeout_floor_s instead, e.g. "
                             '{"detectors": {"hang": {"timeout_floor_s": 120}}}')
        return None


def upgrade_stored_config(config: Any) -> Any:
    """A stored run config in today's names. Configs stored before the rename carry the hang
    detector's floor as a top-level ``hang_timeout_floor_s`` (every one carries the key, most of
    them null); it becomes ``detectors.hang.timeout_floor_s`` unless that is set, which wins, as it
    always did. Anything else is left for validation to judge."""
    if not isinstance(config, dict) or LEGACY_HANG_FLOOR not in config:
        return config
    config = dict(config)
    floor = config.pop(LEGACY_HANG_FLOOR)
    detectors = config.get("detectors") if config.get("detectors") is not None else {}
    if floor is None or not isinstance(detectors, dict) or not isinstance(detectors.get("hang", {}), dict):
        return config
    hang = detectors.get("hang", {})
    if "timeout_floor_s" not in hang:
        config["detectors"] = {**detectors, "hang": {"timeout_floor_s": floor, **hang}}
    return config


class CheckpointIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: NonNegInt = Field(..., description="Step whose update the checkpoint includes (state after step's update).")
    uri: str = Field(..., min_length=1, max_length=2048, description="Where the checkpoint lives, e.g. s3://bucket/run/step1200.")
    duration_s: Seconds | None = Field(None, description="Time the training was blocked writing it, seconds.")
    bytes: NonNegInt | None = Field(None, description="Size of the checkpoint, bytes.")


class CheckpointStatusIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Literal["ok", "verified", "bad", "deleted"] = Field(
        ..., description="verified = known clean; bad = known corrupted; deleted = no longer available (never recommended).")
    note: str | None = Field(None, max_length=1000, description="Why, for the people reading the run later.")


class Checkpoint(BaseModel):
    id: int = Field(..., description="Identifier of the checkpoint record (for PATCH).")
    step: int = Field(..., description="Step whose update the checkpoint includes.")
    uri: str = Field(..., description="Where the checkpoint lives.")
    attempt: int = Field(..., description="Attempt that wrote it.")
    duration_s: float | None = Field(None, description="Write duration, seconds.")
    bytes: int | None = Field(None, description="Size, bytes.")
    created_at: float = Field(..., description="When the service recorded it, unix seconds.")
    status: str = Field(..., description="ok | verified | bad | deleted.")
    note: str | None = Field(None, description="Why its status was set, if someone said.")


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: NonNegInt = Field(..., description="Rank sending the heartbeat (below max_ranks).")
    step: NonNegInt | None = Field(None, description="Step the rank is working on.")
    phase: Literal[HEARTBEAT_PHASES] | None = Field(  # type: ignore[valid-type]
        None, description="What the rank is doing now: " + ", ".join(HEARTBEAT_PHASES) + ".")


class EventIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal[EVENT_KINDS] = Field(..., description="What happened: " + ", ".join(EVENT_KINDS) + ".")  # type: ignore[valid-type]
    step: NonNegInt | None = Field(None, description="Step it relates to (for a rollback: the checkpoint step resumed from).")
    data: dict[str, Any] = Field(default_factory=dict, description="Details, e.g. {\"old\": 8, \"new\": 6} for world_size_change.")

    @field_validator("data")
    @classmethod
    def _storable(cls, data: dict[str, Any]) -> dict[str, Any]:
        check_storable(data)
        if "new" in data or "old" in data:
            for key in ("old", "new"):
                v = data.get(key)
                if v is not None and (type(v) is not int or not 1 <= v <= INT64_MAX):
                    raise ValueError(f"data.{key} must be a world size (an integer >= 1), got {v!r}")
        return data


class FinishIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: NonNegInt | None = Field(None, description="The rank that finished; omitted: the whole run finished. "
                                                      "The run is finished once every rank that reported has finished.")
    step: NonNegInt | None = Field(None, description="The last step the rank completed.")


class Event(BaseModel):
    id: int = Field(..., description="Identifier, increasing in the order events were recorded.")
    kind: str = Field(..., description="What happened: " + ", ".join(EVENT_KINDS) + ".")
    step: int | None = Field(..., description="Step it relates to, if any.")
    attempt: int = Field(..., description="Attempt current when it was recorded.")
    ts: float = Field(..., description="When the service recorded it, unix seconds.")
    data: dict[str, Any] = Field(..., description="Details as sent.")


class Heartbeat(BaseModel):
    rank: int = Field(..., description="The rank.")
    step: int | None = Field(None, description="Step it was working on.")
    phase: str | None = Field(None, description="What it was doing: " + ", ".join(HEARTBEAT_PHASES) + ".")
    ts: float = Field(..., description="When its latest heartbeat arrived, unix seconds (service clock).")


class Ok(BaseModel):
    ok: bool = Field(True, description="The request was carried out (and is durable).")


class AttemptSummary(BaseModel):
    attempt: int = Field(..., description="1-based attempt number; a new one opens when reported steps go back.")
    start_step: int = Field(..., description="First step of the attempt.")
    last_step: int = Field(..., description="Highest step reported in the attempt.")
    n_records: int = Field(..., description="Records stored in the attempt.")
    opened_at: float = Field(..., description="Unix seconds.")


class RunSummary(BaseModel):
    """A run at a glance. Features add sections (health, active_findings, rollback, timeline)."""
    model_config = ConfigDict(extra="allow")
    run_id: str = Field(..., description="The run's identifier.")
    status: str = Field(..., description="running | finished.")
    created_at: float = Field(..., description="Unix seconds.")
    last_push: float | None = Field(None, description="Last accepted metrics push, unix seconds.")
    finished_at: float | None = Field(None, description="Unix seconds.")
    attempt: int = Field(..., description="Current attempt (0 before any metrics).")
    last_step: int | None = Field(None, description="Highest step of the current attempt.")
    world_size: int | None = Field(None, description="Configured world size, else ranks seen in the current attempt.")
    ranks_seen: int = Field(..., description="Ranks that reported in the current attempt.")
    config: RunConfig = Field(..., description="The run's configuration (PUT /v1/runs/{run_id}).")
    config_error: str | None = Field(None, description="Set when the stored config no longer validates (say, written "
                                                       "by an older version): the run is watched with default "
                                                       "detector parameters until a PUT fixes it.")
    attempts: list[AttemptSummary] = Field(default_factory=list, description="Every attempt, oldest first (detail view).")
    health: str | None = Field(None, description="ok | warning | critical: the worst active finding (detail view); "
                                                  "an acknowledged alert still counts.")
    findings_by_kind: dict[str, int] | None = Field(None, description="Firing findings ever recorded, by kind (detail view).")
    active_findings: list[dict[str, Any]] | None = Field(
        None, description="Findings still firing, as in GET .../findings (detail view), each with its alert's "
                           "state under 'alert' ({fingerprint, status, acknowledged_at, acknowledged_by}; null "
                           "before alerting has it). A finding whose alert was resolved since (by hand, by a "
                           "rollback past its onset, or by its condition staying clear) is not listed.")
    rollback: dict[str, Any] | None = Field(
        None, description="The checkpoint to resume from now ({id, step, uri}), as in GET .../rollback (detail view).")
    timeline: Any = Field(None, description="The newest entries of the run timeline, as in GET .../timeline (detail view).")
