"""The C allocator under ``healthsvc serve`` (issue 25's soak: memory flat after warm-up;
``healthsvc.ops.allocator`` says why): malloc's arenas stay within ``malloc_arena_max``
however many threads allocate, and what a burst of pushes freed is given back to the system
by the periodic trim, not kept resident until the next peak. Real servers on 127.0.0.1, glibc
only (what the figures on /metrics count)."""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from healthsvc.ops import allocator
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not allocator.available(), reason="glibc malloc only")]

RANKS = 4096
FIELDS = ("loss", "grad_norm", "local_grad_norm", "step_time", "compute_time", "comm_time")


def metric(http: httpx.Client, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", http.get("/metrics").text, re.M).group(1))


def burst(http: httpx.Client, run_id: str, steps: int) -> None:
    """Pushes of every one of 4,096 ranks: a few MB parsed, stored and fed to the detectors per
    step (the kind of peak a takeover's restore or a queue under load makes)."""
    assert http.put(f"/v1/runs/{run_id}", json={"world_size": RANKS}).status_code == 200
    for step in range(steps):
        cols: dict[str, list] = {"step": [step] * RANKS, "rank": list(range(RANKS))}
        for i, f in enumerate(FIELDS):
            cols[f] = [1.0 + 0.001 * r + i + step / 100 for r in range(RANKS)]
        r = http.post(f"/v1/runs/{run_id}/metrics", content=orjson.dumps({"columns": cols}),
                      headers={"content-type": "application/json"})
        assert r.status_code == 202, r.text


def many_threads_read(url: str, run_id: str) -> None:
    """Reads from 16 client threads at once: the server answers them on its worker threads
    (each of which takes a malloc arena of its own when glibc is left at its default)."""
    def reads(_: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            for _ in range(10):
                assert c.get(f"/v1/runs/{run_id}/metrics", params={"fields": "loss", "ranks": "7"}).status_code == 200
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(reads, range(16)))


def test_arenas_stay_within_the_cap_however_many_threads_allocate(tmp_path):
    arenas = {}
    for cap in ("0", "2"):   # 0: glibc's default (8 a core), what the server had before
        with ServerProcess(tmp_path / f"cap{cap}.db", env={"HEALTHSVC_MALLOC_ARENA_MAX": cap}) as server, \
                httpx.Client(base_url=server.url, timeout=60) as http:
            burst(http, "a", 3)
            many_threads_read(server.url, "a")
            arenas[cap] = metric(http, "healthsvc_malloc_arenas")
    assert arenas["0"] > 2, arenas          # the load does spread over arenas left uncapped
    assert 1 <= arenas["2"] <= 2, arenas


def test_what_a_burst_freed_is_given_back(tmp_path):
    with ServerProcess(tmp_path / "t.db", env={"HEALTHSVC_MALLOC_TRIM_EVERY_S": "0.2"}) as server, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        burst(http, "b", 20)
        # The barrier: two trims begun after the burst (the first may have been under way).
        trims, deadline = metric(http, "healthsvc_malloc_trims_total"), time.monotonic() + 30
        while metric(http, "healthsvc_malloc_trims_total") < trims + 2:
            assert time.monotonic() < deadline, "no trim within 30 s"
        returned = metric(http, "healthsvc_malloc_trimmed_bytes_total")
    # Measured: about 30 MiB given back after these 20 pushes (RSS 197 -> 182 MiB); without
    # the trim glibc keeps all of it (only the top of the main heap is ever returned).
    assert returned >= 4 * 2**20, returned


def test_a_burst_is_given_back_when_the_rss_grew_not_only_on_the_period(tmp_path):
    # The period is an hour: only the growth of the RSS since the last trim can start one. Under
    # a busy replica the RSS then says what the process holds, not when the last trim was.
    env = {"HEALTHSVC_MALLOC_TRIM_EVERY_S": "3600", "HEALTHSVC_MALLOC_TRIM_GROWN_MIB": "4"}
    with ServerProcess(tmp_path / "g.db", env=env) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        burst(http, "g", 20)
        deadline = time.monotonic() + 30
        while metric(http, "healthsvc_malloc_trimmed_bytes_total") < 4 * 2**20:
            assert time.monotonic() < deadline, "nothing given back within 30 s of the burst"

