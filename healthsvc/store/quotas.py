"""What one store holds at most: runs, and distinct metric names per run.

Both bound memory and the cost of reads that no rate limit bounds: each run keeps its state in
memory (about 100 KB with its monitor), and a run's metric names are columns every read of it
walks (200,000 names made reading one step take minutes). The store refuses the write that
would cross a quota, before it changes anything, with :class:`QuotaExceeded`; the service
answers 429 for runs (the store is full of them) and 422 for names (the push is wrong).

    QuotaExceeded
    ├── TooManyRuns         a new run beyond ``max_runs``
    ├── TooManyRunsOfToken  a new run beyond ``max_runs_per_token`` of the token that asks
    └── TooManyMetricNames  a push whose new names take its run beyond ``max_metric_names``
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

DEFAULT_MAX_RUNS = 10_000
DEFAULT_MAX_RUNS_PER_TOKEN = 1_000   # a tenth of the service's runs: one token cannot fill it alone


@dataclass(frozen=True)
class Creator:
    """Who a run made now is counted against: a token (its id is stored, its name is shown)."""
    token_id: str
    name: str


# The creator of the request being served, set by the request guard (healthsvc.auth.guard) and
# carried into the store's writer thread with each job (``MetricsIngest.run_job``): None in open
# mode and for admin tokens (operators, replays), whose runs count against ``max_runs`` only.
creator: ContextVar[Creator | None] = ContextVar("healthsvc_run_creator", default=None)
DEFAULT_MAX_METRIC_NAMES = 1024   # the known fields are 20; per-layer norms of a large model a few hundred


@dataclass(frozen=True)
class Quotas:
    max_runs: int = DEFAULT_MAX_RUNS
    max_runs_per_token: int = DEFAULT_MAX_RUNS_PER_TOKEN   # 0: no cap per token
    max_metric_names: int = DEFAULT_MAX_METRIC_NAMES


class QuotaExceeded(Exception):
    """A write would take the store beyond a quota; nothing of it was stored."""

    setting = ""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class TooManyRuns(QuotaExceeded):
    setting = "max_runs"

    def __init__(self, run_id: str, limit: int) -> None:
        super().__init__(f"run {run_id!r} would be a new run beyond this service's limit of {limit} runs "
                         f"(setting max_runs)", limit)


class TooManyRunsOfToken(QuotaExceeded):
    setting = "max_runs_per_token"

    def __init__(self, run_id: str, who: Creator, limit: int) -> None:
        super().__init__(f"run {run_id!r} would be a new run beyond the limit of {limit} runs per token: token "
                         f"{who.name!r} ({who.token_id}) has created {limit} (setting max_runs_per_token)", limit)


class TooManyMetricNames(QuotaExceeded):
    setting = "max_metric_names"

    def __init__(self, run_id: str, new: list[str], known: int, limit: int) -> None:
        shown = ", ".join(repr(n) for n in new[:3]) + (", ..." if len(new) > 3 else "")
        super().__init__(f"run {run_id!r} has {known} distinct metric names; {len(new)} new ones ({shown}) would "
                         f"take it beyond the limit of {limit} per run (setting max_metric_names)", limit)
        self.new = new
