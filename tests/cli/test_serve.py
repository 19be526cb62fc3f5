"""What ``healthsvc serve`` sets up around the app.

The garbage collector: it leaves what start-up built out of the garbage collector's full
collections (``gc.freeze``), once the app is built and before the server runs: the collections
walk every tracked object, and start-up's are most of them and live as long as the process. And
it collects the youngest generation only after ``GC_YOUNG_THRESHOLD`` objects: the real server
takes pushes of 1,024 records in rows (a dict each) without a collection per push.

The access log: the only reader of the client's address behind a proxy."""
from __future__ import annotations

import gc

from healthsvc import cli


def test_serve_freezes_the_start_up_objects_before_the_server_runs(tmp_path, monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: events.append("freeze"))
    monkeypatch.setattr(gc, "set_threshold", lambda *t: events.append(("threshold", t)))   # not this process's

    def run(app, **kwargs):
        events.append("run")
        assert callable(app) and kwargs["host"] == "127.0.0.1"
    monkeypatch.setattr("uvicorn.run", run)
    monkeypatch.setattr("healthsvc.ops.allocator.tune", lambda arena_max: False)   # not this process's
    assert cli.main(["serve", "--db", str(tmp_path / "serve.db"), "--host", "127.0.0.1", "--port", "1"]) == 0
    _, older, oldest = gc.get_threshold()
    assert events == ["freeze", ("threshold", (cli.GC_YOUNG_THRESHOLD, older, oldest)), "run"]


def test_the_served_process_takes_large_row_pushes_without_a_young_collection_each(tmp_path):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from tests.server_process import ServerProcess

    def young_collections(url: str) -> float:
        text = httpx.get(url + "/metrics", timeout=10).text
        return next(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                    if s.name == "python_gc_collections_total" and s.labels["generation"] == "0")

    records = [{"step": 0, "rank": r, "loss": 2.0, "grad_norm": 1.0, "step_time": 0.5} for r in range(1024)]
    server = ServerProcess(str(tmp_path / "gc.db"), log_path=tmp_path / "server.log")
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for step in range(3):   # warm: the run exists, the routes' first calls are made
                body = {"records": [{**rec, "step": step} for rec in records]}
                assert http.post("/v1/runs/gc/metrics", json=body).status_code == 202
            before = young_collections(server.url)
            for step in range(3, 43):
                body = {"records": [{**rec, "step": step} for rec in records]}
                assert http.post("/v1/runs/gc/metrics", json=body).status_code == 202
            after = young_collections(server.url)
    finally:
        server.stop()
    # At Python's default of 700, each push's 1,024 records alone made three collections (120).
    assert after - before < 40, (before, after)


def test_the_access_log_names_the_client_a_local_proxy_forwarded_for(tmp_path):
    """The forwarded address is worked out for the access log only (``serve`` leaves uvicorn's
    proxy-headers step out when the log is off): with the log on, a request that a proxy on
    this host forwarded is logged with the client's address, not the proxy's."""
    import httpx

    from tests.server_process import ServerProcess

    log = tmp_path / "server.log"
    server = ServerProcess(str(tmp_path / "log.db"), log_path=log, extra_args=["--access-log", "--log-level", "info"])
    server.start()
    try:
        r = httpx.get(server.url + "/healthz", headers={"x-forwarded-for": "203.0.113.7"}, timeout=10)
        assert r.status_code == 200
    finally:
        server.stop()   # the log is flushed and complete once the process is gone
    lines = [line for line in log.read_text().splitlines() if "GET /healthz" in line]
    assert lines and "203.0.113.7" in lines[-1], lines
