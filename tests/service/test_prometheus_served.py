"""/metrics scraped from a real server (uvicorn on 127.0.0.1, the service's fake clock): the
steps counter keeps counting through a rollback while the last-step gauge goes down, and
through a restart of the service, per-rank
series stay at most ``metrics_top_ranks`` per run at 16,384 ranks (the ranks findings name, then
the slowest), and the process collectors are on the service's registry."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import ServedService

RANK_FAMILIES = ("healthsvc_run_rank_time_ratio", "healthsvc_run_rank_time_seconds",
                 "healthsvc_run_rank_active_findings")


def scrape(c: httpx.Client) -> dict[str, list]:
    text = c.get("/metrics").text
    return {fam.name: fam.samples for fam in text_string_to_metric_families(text)}


def sample(fams: dict[str, list], name: str, **labels: str) -> float | None:
    found = [s.value for s in fams.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def push_steps(c: httpx.Client, run: str, steps: range, ranks: int = 2) -> None:
    cols = {"step": [s for s in steps for _ in range(ranks)], "rank": [r for _ in steps for r in range(ranks)],
            "loss": [2.0] * (len(steps) * ranks), "step_time": [0.5] * (len(steps) * ranks)}
    assert c.post(f"/v1/runs/{run}/metrics", json={"columns": cols}).status_code == 202


def test_the_steps_counter_keeps_counting_through_a_rollback_where_the_gauge_goes_down(tmp_path):
    with ServedService(tmp_path) as svc:
        c = svc.http
        push_steps(c, "r", range(0, 60))
        push_steps(c, "r", range(60, 100))
        svc.drain()
        fams = scrape(c)
        assert fams["healthsvc_run_steps"][0].name == "healthsvc_run_steps_total"   # a counter
        assert sample(fams, "healthsvc_run_steps", run="r") == 100
        assert sample(fams, "healthsvc_run_last_step", run="r") == 99

        push_steps(c, "r", range(50, 80))    # a rollback to the checkpoint at step 49
        svc.drain()
        fams = scrape(c)
        assert sample(fams, "healthsvc_run_last_step", run="r") == 79, "the gauge goes down"
        assert sample(fams, "healthsvc_run_steps", run="r") == 130, "the counter does not: steps 50..79 trained again"
        push_steps(c, "r", range(80, 90))
        svc.drain()
        assert sample(scrape(c), "healthsvc_run_steps", run="r") == 140
    with ServedService(tmp_path, clock=svc.clock) as again:   # restarted on the same store
        assert sample(scrape(again.http), "healthsvc_run_steps", run="r") == 140, "it goes on from the same count"
        push_steps(again.http, "r", range(90, 95))
        again.drain()
        assert sample(scrape(again.http), "healthsvc_run_steps", run="r") == 145


def test_per_rank_series_are_the_named_and_the_slowest_ranks_at_most_k_of_16384(tmp_path):
    world, k = 16384, 4
    slow = {12345: 3.0, 777: 2.0, 9000: 1.5, 5: 1.2}
    with ServedService(tmp_path, metrics_top_ranks=k) as svc:
        c = svc.http
        for step in range(2):
            ranks = list(range(world))
            compute = [slow.get(r, 1.0) for r in ranks]
            loss = ["NaN" if step == 1 and r == 4242 else 2.0 for r in ranks]
            cols = {"step": [step] * world, "rank": ranks, "loss": loss, "compute_time": compute,
                    "step_time": [3.1] * world, "host": [f"node{r // 8}" for r in ranks]}
            assert c.post("/v1/runs/big/metrics", json={"columns": cols}).status_code == 202
        push_steps(c, "small", range(3))     # another run: its own k, step_time ranked
        svc.drain()
        fams = scrape(c)

        def ranks_of(run: str) -> set[str]:
            return {s.labels["rank"] for name in RANK_FAMILIES for s in fams.get(name, []) if s.labels["run"] == run}

        assert ranks_of("big") == {"4242", "12345", "777", "9000"}, "k = 4: the named rank, then the 3 slowest"
        named = sample(fams, "healthsvc_run_rank_active_findings", run="big", rank="4242")
        assert named is not None and named >= 1
        assert sample(fams, "healthsvc_run_rank_active_findings", run="big", rank="12345") == 0
        assert sample(fams, "healthsvc_run_rank_time_ratio", run="big", rank="12345", host="node1543",
                      field="compute_time") == 3.0
        assert sample(fams, "healthsvc_run_rank_time_ratio", run="big", rank="777", field="compute_time") == 2.0
        assert sample(fams, "healthsvc_run_rank_time_seconds", run="big", rank="9000", field="compute_time") == 1.5
        assert sample(fams, "healthsvc_run_rank_time_ratio", run="big", rank="4242", host="node530") == 1.0
        assert len(ranks_of("small")) == 2   # fewer ranks than k: all of them
        assert {s.labels["field"] for s in fams["healthsvc_run_rank_time_ratio"] if s.labels["run"] == "small"} \
            == {"step_time"}
        assert len([s for name in RANK_FAMILIES for s in fams[name]]) <= 3 * k * 2


def test_process_metrics_are_on_the_service_registry(tmp_path):
    with ServedService(tmp_path) as svc:
        fams = scrape(svc.http)
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds", "python_info"):
        assert fams.get(name), name
    assert sample(fams, "process_resident_memory_bytes") > 10e6
