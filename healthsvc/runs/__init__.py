"""Runs (a feature): a run's summary, config, history, checkpoints and events (``api``), and the
summary features add sections to (``service``)."""
from healthsvc.runs.service import RunSummaries, shown_config

__all__ = ["RunSummaries", "shown_config"]
