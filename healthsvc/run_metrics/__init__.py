"""Per-run series on ``/metrics`` for Prometheus and Grafana (a feature of the service).

Series, for *active* runs only (status ``running`` and a push within ``metrics_run_window_s``,
default an hour; at most ``metrics_max_runs``, the most recently pushed, default 100), so the
number of series stays bounded however many runs the store keeps:

    healthsvc_run_health{run}                          0 ok, 1 warning, 2 critical (worst active finding)
    healthsvc_run_last_step{run}                       highest step of the current attempt (a gauge:
                                                       it goes down at a rollback)
    healthsvc_run_steps_total{run}                     steps trained, a counter (``steps.py``, read
                                                       from the store's attempts): the one to ``rate()``
    healthsvc_run_last_push_timestamp_seconds{run}     last accepted push, unix seconds
    healthsvc_run_step_time_median_seconds{run}        median step_time over the last values pushed
                                                       (``STEP_TIME_WINDOW`` per run, all ranks)
    healthsvc_run_active_findings{run,kind,severity}   firing findings, by kind and severity
    healthsvc_run_rank_time_ratio{run,rank,host,field} newest timing over the median of all ranks'
    healthsvc_run_rank_time_seconds{run,rank,host,field} the rank's newest timing
    healthsvc_run_rank_active_findings{run,rank,host}  active findings naming the rank
                                                       (the three: at most ``metrics_top_ranks``
                                                       ranks per run, ``ranks.py``)
    healthsvc_runs_exported                            how many runs the series above cover

A finished run, or one silent for longer than the window, drops out at the next scrape.
``docs/grafana-dashboard.json`` is a dashboard built on these series.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from healthsvc.run_metrics.feed import new_batches
from healthsvc.run_metrics.ranks import RankTimes, named_ranks
from healthsvc.run_metrics.step_times import STEP_TIME_WINDOW, StepTimes
from healthsvc.run_metrics.steps import steps_trained
from healthsvc.store.results import RunsReleased

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


__all__ = ["RankTimes", "RunSeriesCollector", "StepTimes", "install", "steps_trained"]

HEALTH_VALUE = {"ok": 0, "warning": 1, "critical": 2}


class RunSeriesCollector:
    """Prometheus collector: reads the store and the findings at scrape time."""

    def __init__(self, ctx: ServiceContext, step_times: StepTimes, rank_times: RankTimes) -> None:
        self.ctx = ctx
        self.step_times = step_times
        self.rank_times = rank_times

    def active_runs(self, now: float) -> list[tuple[str, Any]]:
        """(run_id, run state) of the runs exported now, most recently pushed first."""
        s, store = self.ctx.settings, self.ctx.store
        out = []
        for row in store.reads.list_run_rows():
            if row["status"] != "running":
                continue   # first: a finished run's state may have to be read back (run_view)
            st = store.reads.run_view(row["run_id"])
            if st is None or st.last_push is None:
                continue
            if now - st.last_push <= s.metrics_run_window_s:
                out.append((row["run_id"], st))
        out.sort(key=lambda item: item[1].last_push or 0.0, reverse=True)   # None filtered above
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
        steps = CounterMetricFamily("healthsvc_run_steps", "Steps trained by the run, counted again when "
                                    "trained again after a rollback or restart (monotonic, unlike "
                                    "healthsvc_run_last_step): rate() it for steps per second.", labels=["run"])
        rank_labels = ["run", "rank", "host", "field"]
        ratio = GaugeMetricFamily("healthsvc_run_rank_time_ratio", "A top rank's newest timing (field) over the "
                                  "median of all its run's ranks' newest; at most HEALTHSVC_METRICS_TOP_RANKS "
                                  "ranks per run: those named by active findings, then the slowest.",
                                  labels=rank_labels)
        seconds = GaugeMetricFamily("healthsvc_run_rank_time_seconds", "A top rank's newest timing (field), "
                                    "seconds.", labels=rank_labels)
        rank_findings = GaugeMetricFamily("healthsvc_run_rank_active_findings", "Active findings naming a top "
                                          "rank.", labels=["run", "rank", "host"])
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
            steps.add_metric([run_id], steps_trained(self.ctx.store.reads.attempts(run_id)))
            for line in self.rank_times.top(run_id, self.ctx.settings.metrics_top_ranks, named_ranks(active)):
                labels = [run_id, str(line.rank), line.host or ""]
                if line.ratio is not None:
                    ratio.add_metric(labels + [line.field], line.ratio)
                if line.value is not None:
                    seconds.add_metric(labels + [line.field], line.value)
                rank_findings.add_metric(labels, line.findings)
            median = self.step_times.median(run_id)
            if median is not None:
                step_time.add_metric([run_id], median)
            for (kind, severity), n in sorted(Counter((sf.finding.kind, sf.finding.severity) for sf in active).items()):
                findings.add_metric([run_id, kind, severity], n)
        exported.add_metric([], len(runs))
        kept = {run_id for run_id, _ in runs}
        for part in (self.step_times, self.rank_times):
            part.keep_only(kept)
        yield from (health, last_step, steps, last_push, step_time, findings, ratio, seconds, rank_findings, exported)


class RunSeries:
    """The per-run series ``/metrics`` exports, fed every commit's results by the pipeline; a
    run let go (``RunsReleased``: finished and quiet) is forgotten by each."""

    def __init__(self, parts: tuple[Any, ...]) -> None:
        self.parts = parts

    def committed(self, results: list[Any]) -> None:
        pushes = list(new_batches(results))   # chosen once for every part
        if pushes:
            for part in self.parts:
                part.add(pushes)
        released = [run_id for r in results if isinstance(r, RunsReleased) for run_id in r.run_ids]
        if released:
            for part in self.parts:
                part.forget(released)


def install(app: Any, ctx: ServiceContext) -> None:
    """The feature hook (called by ``healthsvc.app.create_app``)."""
    parts = StepTimes(), RankTimes()
    ctx.run_series = RunSeries(parts)   # fed every commit's results by the pipeline (healthsvc.pipeline)
    ctx.metrics.registry.register(RunSeriesCollector(ctx, *parts))
