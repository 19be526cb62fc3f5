"""Per-run series on /metrics in the service: they parse with prometheus_client's text
parser, cover active runs only (not a finished run, not one silent past the window, at most
HEALTHSVC_METRICS_MAX_RUNS), and docs/grafana-dashboard.json queries only series that exist."""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from healthsvc.store.batch import MetricBatch
from healthsvc.run_metrics import StepTimes
from healthsvc.run_metrics.feed import new_batches
from healthsvc.store.results import IngestResult

from tests.harness import InProcessService, ServedService

ROOT = Path(__file__).resolve().parents[2]


def scrape(c: httpx.Client) -> dict[str, list]:
    text = c.get("/metrics").text
    return {fam.name: fam.samples for fam in text_string_to_metric_families(text)}


def runs_in(families: dict[str, list], name: str) -> set[str]:
    return {s.labels["run"] for s in families.get(name, [])}


def push(c: httpx.Client, run: str, steps: range, step_time=lambda s, r: 0.5, nan_at: int | None = None) -> None:
    records = [{"step": s, "rank": r, "loss": "NaN" if s == nan_at and r == 1 else 2.0,
                "step_time": step_time(s, r)} for s in steps for r in range(2)]
    assert c.post(f"/v1/runs/{run}/metrics", json={"records": records}).status_code == 202


def test_per_run_series_cover_active_runs_only(tmp_path):
    # In process on a fake clock: the default window of activity passes in an instant.
    with InProcessService(tmp_path, db=tmp_path / "svc.db", metrics_max_runs=2) as svc:
        c = svc.http
        push(c, "old", range(5))
        push(c, "done", range(5))
        assert c.post("/v1/runs/done/finish", json={}).status_code < 300
        svc.drain()
        assert "old" in runs_in(scrape(c), "healthsvc_run_last_step")
        # "old" leaves the series once its last push is older than the window.
        svc.advance(svc.settings.metrics_run_window_s + 1, step_s=60.0)
        assert "old" not in runs_in(scrape(c), "healthsvc_run_last_step"), "the silent run never dropped out"

        push(c, "a", range(3))
        svc.advance(1.0)   # pushed a second apart: the newest runs are "b" and "live"
        push(c, "b", range(3))
        svc.advance(1.0)
        times = lambda s, r: 0.4 + 0.1 * r + 0.01 * s   # noqa: E731
        push(c, "live", range(12), step_time=times, nan_at=10)
        svc.drain()   # the NaN has become a finding
        fams = scrape(c)
        assert any(s.labels.get("run") == "live" for s in fams.get("healthsvc_run_active_findings", [])), \
            "no finding for the live run"

        for name in ("healthsvc_run_health", "healthsvc_run_last_step", "healthsvc_run_step_time_median_seconds",
                     "healthsvc_run_last_push_timestamp_seconds"):
            assert runs_in(fams, name) == {"live", "b"}, name     # at most 2: the newest; never old/done
        value = {(s.name, s.labels.get("run")): s.value for s in fams["healthsvc_run_health"]
                 + fams["healthsvc_run_last_step"] + fams["healthsvc_run_step_time_median_seconds"]}
        assert value[("healthsvc_run_health", "live")] == 2 and value[("healthsvc_run_health", "b")] == 0
        assert value[("healthsvc_run_last_step", "live")] == 11
        pushed = [times(s, r) for s in range(12) for r in range(2)]
        assert abs(value[("healthsvc_run_step_time_median_seconds", "live")] - statistics.median(pushed)) < 1e-9
        live = {(s.labels["kind"], s.labels["severity"]): s.value
                for s in fams["healthsvc_run_active_findings"] if s.labels["run"] == "live"}
        assert live.get(("non_finite", "critical"), 0) >= 1
        assert [s.value for s in fams["healthsvc_runs_exported"]] == [2]


def test_the_grafana_dashboard_uses_the_series_the_service_exports(server, http):
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
              for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = {m for e in exprs for m in re.findall(r"\bhealthsvc_[a-z_]+", e)}
    push(http, "g", range(3))
    fams = scrape(http)
    exported = set(fams) | {s.name for samples in fams.values() for s in samples}   # a counter's _total too
    assert used and used <= exported, used - exported
    assert {"healthsvc_run_health", "healthsvc_run_active_findings", "healthsvc_run_step_time_median_seconds",
            "healthsvc_run_last_step"} <= used


def families_by_type(c: httpx.Client) -> dict[str, str]:
    """Metric family name -> type ("counter", "gauge", ...) as the service exposes them."""
    return {fam.name: fam.type for fam in text_string_to_metric_families(c.get("/metrics").text)}


def test_the_dashboard_rates_counters_only_and_links_every_panel_to_the_run_page(tmp_path):
    # rate() over a gauge that goes down (the last step at a rollback) reads the drop as a counter
    # reset: every rate/irate/increase the dashboard draws must be over a counter.
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    rated = {m for e in exprs for m in re.findall(r"\b(?:rate|irate|increase)\((healthsvc_[a-z_]+)", e)}
    assert "healthsvc_run_steps_total" in rated
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    base = variables["service_url"]["query"]
    with ServedService(tmp_path) as svc:
        c = svc.http
        push(c, "run-1", range(3))
        svc.drain()
        types = families_by_type(c)
        assert all(types.get(name.removesuffix("_total")) == "counter" for name in rated), \
            {name: types.get(name.removesuffix("_total")) for name in rated}
        for panel in dashboard["panels"]:
            links = panel["fieldConfig"]["defaults"].get("links", [])
            assert links, f"panel {panel['title']!r} has no data link"
            # Grafana's interpolation, for one run: the link must open the run's dashboard page.
            url = links[0]["url"]
            for ref in ("${__field.labels.run}", "${__data.fields.run}"):
                url = url.replace(ref, "run-1")
            url = url.replace("${service_url}", svc.url)
            assert url == f"{svc.url}/runs/run-1", (panel["title"], links[0]["url"])
            page = httpx.get(url, timeout=30)
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert base.startswith("http")


def test_the_step_time_median_is_over_the_newest_finite_values_whatever_the_pushes():
    # Property: pushes of random sizes, with NaN, infinities and unreported values among them; the
    # median is over the newest `window` finite values, whenever it is asked. A third of the
    # pushes are larger than the window (one push can fill it alone), half of all are clean, and
    # a fifth report every value (a non-finite value among them still counts for nothing).
    rng = np.random.default_rng(7)
    times, kept = StepTimes(window=64), []
    for i in range(400):
        n = int(rng.integers(1, 40)) if i % 3 else int(rng.integers(64, 150))
        bad = 0.1 if i % 2 else 0.0
        values = rng.uniform(0.1, 2.0, n)
        values[rng.random(n) < bad] = rng.choice([np.nan, np.inf, -np.inf])
        present = rng.random(n) >= bad if i % 5 else np.ones(n, bool)   # some report every value, NaN too
        batch = MetricBatch(np.arange(n), np.zeros(n, np.int64), {"step_time": values}, {"step_time": present})
        times.add(list(new_batches([IngestResult("r", n, i % 50 == 7, 1, False, i, 0.0, batch)])))
        if i % 50 != 7:   # a duplicate adds nothing
            kept += [v for v, p in zip(values.tolist(), present.tolist()) if p and np.isfinite(v)]
        if i % 3 == 0 or i == 399:   # often: a window a push left short would show before later pushes refill it
            assert times.median("r") == pytest.approx(statistics.median(kept[-64:]), abs=0, rel=0)
    assert times.median("unknown") is None
    times.keep_only(set())
    assert times.median("r") is None
