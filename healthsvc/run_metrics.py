"""Per-run series on ``/metrics`` for Prometheus and Grafana (a feature of the service).

Series, for *active* runs only (status ``running`` and a push within ``metrics_run_window_s``,
default an hour; at most ``metrics_max_runs``, the most recently pushed, default 100), so the
number of series stays bounded however many runs the store keeps:

    healthsvc_run_health{run}                          0 ok, 1 warning, 2 critical (worst active finding)
    healthsvc_run_last_step{run}                       highest step of the current attempt
    healthsvc_run_last_push_timestamp_seconds{run}     last accepted push, unix seconds
    healthsvc_run_step_time_median_seconds{run}        median step_time over the last values pushed
                                                       (``STEP_TIME_WINDOW`` per run, all ranks)
    healthsvc_run_active_findings{run,kind,severity}   firing findings, by kind and severity
    healthsvc_runs_exported                            how many runs the series above cover

A finished run, or one silent for longer than the window, drops out at the next scrape.
``docs/grafana-dashboard.json`` is a dashboard built on these series.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import numpy as np
from prometheus_client.core import GaugeMetricFamily

STEP_TIME_WINDOW = 512  # step_time values kept per run for the median (all ranks, newest last)
HEALTH_VALUE = {"ok": 0, "warning": 1, "critical": 2}


class StepTimes:
    """The newest ``STEP_TIME_WINDOW`` finite ``step_time`` values of each run (writer thread in,
    scrape thread out). A push only hands its column over (the writer thread does that for every
    push); the values are filtered and cut to the window when a scrape asks, or when a run holds
    four windows' worth."""

    def __init__(self, window: int = STEP_TIME_WINDOW) -> None:
        self.window = window
        self._parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}   # (values, present), oldest first
        self._held: dict[str, int] = {}      # records in a run's parts
        self._lock = threading.Lock()

    def on_store_results(self, results: list[Any]) -> None:
        for r in results:
            batch = getattr(r, "batch", None)
            if batch is None or getattr(r, "duplicate", False) or "step_time" not in batch.values:
                continue
            with self._lock:
                self._parts.setdefault(r.run_id, []).append((batch.values["step_time"], batch.present["step_time"]))
                held = self._held[r.run_id] = self._held.get(r.run_id, 0) + len(batch)
                if held > 4 * self.window:
                    self._compact(r.run_id)

    def _compact(self, run_id: str) -> np.ndarray:
        """The run's window as one array (the lock held)."""
        v = np.concatenate([values[present] for values, present in self._parts[run_id]])
        v = v[np.isfinite(v)][-self.window:]
        self._parts[run_id], self._held[run_id] = [(v, np.ones(len(v), bool))], len(v)
        return v

    def median(self, run_id: str) -> float | None:
        with self._lock:
            if run_id not in self._parts:
                return None
            v = self._compact(run_id)
        return float(np.median(v)) if v.size else None

    def keep_only(self, run_ids: set[str]) -> None:
        """Forget runs that are no longer exported (bounded memory)."""
        with self._lock:
            for run_id in set(self._parts) - run_ids:
                del self._parts[run_id], self._held[run_id]


class RunSeriesCollector:
    """Prometheus collector: reads the store and the findings at scrape time."""

    def __init__(self, ctx: Any, step_times: StepTimes) -> None:
        self.ctx = ctx
        self.step_times = step_times

    def active_runs(self, now: float) -> list[tuple[str, Any]]:
        """(run_id, run state) of the runs exported now, most recently pushed first."""
        s, store = self.ctx.settings, self.ctx.store
        out = []
        for row in store.list_run_rows():
            st = store.run_view(row["run_id"])
            if row["status"] != "running" or st is None or st.last_push is None:
                continue
            if now - st.last_push <= s.metrics_run_window_s:
                out.append((row["run_id"], st))
        out.sort(key=lambda item: item[1].last_push, reverse=True)
        return out[:s.metrics_max_runs]

    def collect(self):
        now = self.ctx.clock()
        health = GaugeMetricFamily("healthsvc_run_health", "Worst active finding of an active run: 0 ok, "
                                   "1 warning, 2 critical.", labels=["run"])
        last_step = GaugeMetricFamily("healthsvc_run_last_step", "Highest step of the run's current attempt.",
                                      labels=["run"])
        last_push = GaugeMetricFamily("healthsvc_run_last_push_timestamp_seconds",
                                      "Last accepted metrics push of the run, unix seconds.", labels=["run"])
        step_time = GaugeMetricFamily("healthsvc_run_step_time_median_seconds",
                                      f"Median step_time over the run's last {STEP_TIME_WINDOW} values "
                                      "(all ranks), seconds.", labels=["run"])
        findings = GaugeMetricFamily("healthsvc_run_active_findings", "Firing findings of an active run, by "
                                     "kind and severity.", labels=["run", "kind", "severity"])
        exported = GaugeMetricFamily("healthsvc_runs_exported", "Active runs with per-run series (bounded by "
                                     "HEALTHSVC_METRICS_MAX_RUNS).")
        runs = self.active_runs(now)
        for run_id, st in runs:
            active = [af.stored for af in self.ctx.health.active(run_id)]
            worst = max((HEALTH_VALUE.get(sf.finding.severity, 0) if sf.finding.severity != "info" else 0
                         for sf in active), default=0)
            health.add_metric([run_id], worst)
            if st.max_step >= 0:
                last_step.add_metric([run_id], st.max_step)
            last_push.add_metric([run_id], st.last_push)
            median = self.step_times.median(run_id)
            if median is not None:
                step_time.add_metric([run_id], median)
            for (kind, severity), n in sorted(Counter((sf.finding.kind, sf.finding.severity) for sf in active).items()):
                findings.add_metric([run_id, kind, severity], n)
        exported.add_metric([], len(runs))
        self.step_times.keep_only({run_id for run_id, _ in runs})
        yield from (health, last_step, last_push, step_time, findings, exported)


def install(app: Any, ctx: Any) -> None:
    """The feature hook (called by ``healthsvc.app.create_app``)."""
    step_times = StepTimes()
    ctx.store.subscribe(step_times.on_store_results)
    ctx.metrics.registry.register(RunSeriesCollector(ctx, step_times))
