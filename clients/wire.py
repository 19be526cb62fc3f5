"""The v1 wire contract's vocabulary: field names, types and units.

Shared by the trainer-side client and the service (the one module of ``clients`` the service
imports). Standard library only.
"""
from __future__ import annotations

API_PREFIX = "/v1"

# Required integer keys of every per-rank step record.
KEY_FIELDS: dict[str, str] = {
    "step": "Training step (optimizer update index), integer >= 0.",
    "rank": "Global rank of the reporting process, integer >= 0.",
}

# Known numeric fields: name -> description with unit. Unknown numeric fields are kept as extra
# metrics. A value may be a number, a NaN/Infinity/-Infinity token or the strings "NaN",
# "Infinity", "-Infinity"; null or absent means "not reported".
METRIC_FIELDS: dict[str, str] = {
    "loss": "This rank's loss on its own micro-batch (unitless). Spread across ranks is normal.",
    "grad_norm": "Global gradient L2 norm the optimizer sees, after the all-reduce (unitless); identical on all ranks.",
    "local_grad_norm": "This rank's gradient L2 norm before the all-reduce (unitless).",
    "step_time": "Wall time of the whole step on this rank, seconds.",
    "compute_time": "Time this rank spent computing (forward+backward) in the step, seconds.",
    "comm_time": "Time this rank was blocked in collectives in the step, seconds (the slow rank waits least).",
    "data_time": "Time this rank waited for its input batch in the step, seconds.",
    "lr": "Learning rate used for the step's update (unitless).",
    "tokens": "Tokens (or samples) this rank processed in the step, count.",
    "world_size": "Number of ranks in the job when the step ran, count.",
    "ts": "When the rank finished the step, unix seconds (the trainer's clock).",
    "replica_group": ("Replica group of the rank, integer >= 0: ranks of one group must hold identical "
                      "parameters (plain DDP: one group, the default 0; sharded or hybrid-sharded jobs: the "
                      "ranks that hold the same shard)."),
    "data_cursor": ("Data position after the step: samples (or tokens) this rank's sampler has consumed, "
                    "integer >= 0 (from the sampler's state). A resume from a checkpoint must continue it."),
}

# Known numeric fields that must hold integers >= 0 (below 2**53, exact in float64).
INTEGER_FIELDS: tuple[str, ...] = ("replica_group", "data_cursor")

# Known string fields.
STRING_FIELDS: dict[str, str] = {
    "host": "Hostname of the machine running the rank.",
    "param_digest": ("Fingerprint of this rank's replica at the step: a digest of the parameters after the "
                     "update of the step (the state a checkpoint at the step would hold), a string of 1 to "
                     "128 characters (healthsvc_client.digest writes 16 hex digits). Ranks of one replica_group "
                     "must report the same digest at a step."),
    "incarnation": ("Which process sent the record, a string of 1 to 128 characters, the same for every "
                    "record of one process: the client draws a new one when the process starts and when "
                    "its steps go back (an in-process rollback). A rank's new incarnation is a restart (a "
                    "new attempt) even if its steps go on; an incarnation the rank already had is never "
                    "one, so late records (a spool uploaded after the outage) fill their gap. Without it "
                    "a restart is told by a rank's steps going back."),
}
INCARNATION_FIELD = "incarnation"
# The per-record string fields other than ``host`` (which is kept per rank as well).
LABEL_FIELDS: tuple[str, ...] = ("param_digest", INCARNATION_FIELD)

NON_FINITE_STRINGS: dict[str, float] = {
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}

HEARTBEAT_PHASES: tuple[str, ...] = ("data", "compute", "collective", "checkpoint", "idle", "other")

EVENT_KINDS: tuple[str, ...] = (
    "restart",            # the job (or some ranks) restarted; data: {"reason": ...}
    "world_size_change",  # data: {"old": n, "new": m}
    "rollback",           # a rollback was performed; step = the checkpoint step resumed from
    "config_change",
    "note",
)
