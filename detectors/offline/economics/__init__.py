"""Run economics: checkpoint interval advice, retention plans, goodput and the run timeline.

Pure functions over typed records (:mod:`records`); no HTTP, no storage, no clock reads.
The service builds the records from its store and serves the results (docs/economics.md).
"""
from healthsvc_detectors.offline.economics.advice import (IntervalAdvice, MtbfEstimate, MtbfPrior, advise_interval,
                                                checkpoint_cost_s, count_failures,
                                                current_interval_steps, estimate_mtbf)
from healthsvc_detectors.offline.economics.goodput import Goodput, compute_goodput
from healthsvc_detectors.offline.economics.intervals import (daly_interval_s, expected_overhead_fraction,
                                                   expected_wall_per_work, young_interval_s)
from healthsvc_detectors.offline.economics.records import (FAILURE_KINDS, Attempt, CheckpointWrite, Corruption,
                                                 Incident, RunEvent)
from healthsvc_detectors.offline.economics.retention import (GUARANTEE_REASONS, RetentionDecision, RetentionPlan,
                                                   RetentionPolicy, lag_window_steps, plan_retention)
from healthsvc_detectors.offline.economics.timeline import RunTimeline, build_timeline

__all__ = [
    "Attempt", "CheckpointWrite", "Corruption", "FAILURE_KINDS", "GUARANTEE_REASONS", "Goodput",
    "Incident", "IntervalAdvice", "MtbfEstimate", "MtbfPrior", "RetentionDecision",
    "RetentionPlan", "RetentionPolicy", "RunEvent", "RunTimeline", "advise_interval",
    "build_timeline", "checkpoint_cost_s", "compute_goodput", "count_failures",
    "current_interval_steps", "daly_interval_s", "estimate_mtbf", "expected_overhead_fraction",
    "expected_wall_per_work", "lag_window_steps", "plan_retention", "young_interval_s",
]
