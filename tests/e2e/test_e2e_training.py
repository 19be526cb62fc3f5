"""End to end: examples/train.py runs for real (4 gloo ranks on the CPU) against a real server, one
fault at a time, and the service must name the right finding kind, step and rank.

Each test configures its run the way a user of a small job would (PUT /v1/runs/{run} before the
training: 4 ranks, default detector settings), runs the trainer as a subprocess, drains the
service (``shared_http.drain()``: everything the training caused is processed) and reads the
findings API. Runs share one server per module (distinct run ids).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"


def train(url: str, run_id: str, workdir: Path, *args: str, timeout_s: float = 240.0) -> dict:
    """Run the example trainer; returns rank 0's final summary line (JSON)."""
    cmd = [sys.executable, str(TRAIN), "--url", url, "--run-id", run_id, "--log-every", "0",
           "--heartbeat-s", "0.5", "--ckpt-dir", str(workdir / f"ckpt-{run_id}"), *args]
    result = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    summaries = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"done"')]
    assert summaries, result.stdout[-2000:]
    return summaries[-1]


def configure(http, run_id: str, **config) -> None:
    response = http.put(f"/v1/runs/{run_id}", json={"world_size": 4, **config})
    assert response.status_code == 200, response.text


def findings(http, run_id: str, kind: str) -> list[dict]:
    """The firing findings of ``kind`` (after a drain: all the run has caused)."""
    return [f for f in all_findings(http, run_id) if f["kind"] == kind and f["status"] == "firing"]


def all_findings(http, run_id: str) -> list[dict]:
    """Every finding of the run, once the service has processed all it was sent."""
    http.drain()
    response = http.get(f"/v1/runs/{run_id}/findings")
    assert response.status_code == 200, response.text
    return response.json()


def raised(found: list[dict]) -> list[dict]:
    """What a healthy run must not raise: every finding but an info-level straggler.

    The four ranks share two cores with the rest of the suite, so a neighbour can slow one rank
    for a few steps; that is a true straggler, and the severity policy keeps it at ``info`` (no
    page) until it lasts ``min_duration_s``. Everything else, and any straggler that pages, counts.
    """
    return [f for f in found if not (f["kind"] == "straggler" and f["severity"] == "info")]


@pytest.fixture(scope="module")
def url(shared_server) -> str:
    return shared_server.url


def test_healthy_run_reports_every_rank_every_step_and_raises_nothing(url, shared_http, tmp_path):
    summary = train(url, "e2e-healthy", tmp_path, "--steps", "80", "--ckpt-every", "40")
    assert summary["delivered"] and summary["client"]["dropped"] == 0
    run = shared_http.get("/v1/runs/e2e-healthy").json()
    assert run["status"] == "finished" and run["ranks_seen"] == 4 and run["last_step"] == 79
    checkpoints = shared_http.get("/v1/runs/e2e-healthy/checkpoints").json()
    assert [c["step"] for c in checkpoints] == [39, 79]
    # Replica fingerprints are on by default (every 20 steps): every rank sent one, all equal.
    cols = shared_http.get("/v1/runs/e2e-healthy/metrics", params={"fields": "param_digest"}).json()["columns"]
    sent = [(s, r, d) for s, r, d in zip(cols["step"], cols["rank"], cols["param_digest"]) if d is not None]
    assert sorted({s for s, _, _ in sent}) == [19, 39, 59, 79] and len(sent) == 16
    assert all(len({d for s2, _, d in sent if s2 == s}) == 1 for s in (19, 39, 59, 79))
    assert [f["kind"] for f in raised(all_findings(shared_http, "e2e-healthy"))] == []


def test_nan_on_one_rank_is_found_at_its_step_and_rank_and_stays_nan(url, shared_http, tmp_path):
    configure(shared_http, "e2e-nan")
    summary = train(url, "e2e-nan", tmp_path, "--steps", "70", "--fault", "nan",
                    "--fault-rank", "2", "--fault-step", "50")
    assert summary["skipped_updates"] == 1
    origin = [f for f in findings(shared_http, "e2e-nan", "non_finite") if f["ranks"] == [2]]
    assert origin and {f["step"] for f in origin} == {50}
    # NaN made the whole trip (client -> ingest -> store -> API) as NaN, not as missing.
    history = shared_http.get("/v1/runs/e2e-nan/metrics",
                              params={"step_min": 50, "step_max": 50, "fields": "loss"}).json()
    by_rank = dict(zip(history["columns"]["rank"], history["columns"]["loss"]))
    assert by_rank[2] == "NaN" and all(isinstance(by_rank[r], float) and math.isfinite(by_rank[r])
                                       for r in (0, 1, 3))


def test_aggregator_mode_sends_all_ranks_from_rank_0_and_nan_still_names_its_rank(url, shared_http, tmp_path):
    configure(shared_http, "e2e-aggregate")
    summary = train(url, "e2e-aggregate", tmp_path, "--steps", "70", "--aggregate", "--fault", "nan",
                    "--fault-rank", "1", "--fault-step", "40")
    assert summary["client"]["columns_logged"] == 70 and summary["client"]["logged"] == 0
    run = shared_http.get("/v1/runs/e2e-aggregate").json()
    assert run["ranks_seen"] == 4 and run["last_step"] == 69
    origin = [f for f in findings(shared_http, "e2e-aggregate", "non_finite") if f["ranks"] == [1]]
    assert origin and {f["step"] for f in origin} == {40}


@pytest.fixture(scope="module")
def spiked_run(url, shared_http, tmp_path_factory) -> list[dict]:
    """Every rank's loss (and so its gradient) is multiplied by 10 at step 80, once."""
    configure(shared_http, "e2e-spike")
    train(url, "e2e-spike", tmp_path_factory.mktemp("spike"), "--steps", "100", "--fault", "loss_spike",
          "--fault-rank", "-1", "--fault-step", "80", "--spike-factor", "10")
    return all_findings(shared_http, "e2e-spike")


def test_loss_spike_is_found_at_its_step(spiked_run):
    spikes = [f for f in spiked_run if f["kind"] in ("loss_spike", "grad_spike") and f["status"] == "firing"]
    assert spikes and {f["onset_step"] for f in spikes} == {80}
    assert min(f["step"] for f in spikes) == 80


def test_loss_spike_is_reported_as_a_loss_spike(spiked_run):
    # A 10x loss is "large" (at least twice its baseline): a warning at once, then it recovers.
    loss = [f for f in spiked_run if f["kind"] == "loss_spike" and f["status"] == "firing"]
    assert [(f["step"], f["severity"]) for f in loss] == [(80, "warning")]
    # The gradient norm jumped with it, but on its own that is a leading signal, not a page.
    grad = [f for f in spiked_run if f["kind"] == "grad_spike" and f["status"] == "firing"]
    assert grad and {f["severity"] for f in grad} == {"info"}


def test_strong_straggler_is_blamed(url, shared_http, tmp_path):
    configure(shared_http, "e2e-straggler")
    train(url, "e2e-straggler", tmp_path, "--steps", "120", "--fault", "straggler",
          "--fault-rank", "1", "--fault-step", "20", "--slow-factor", "3")
    stragglers = findings(shared_http, "e2e-straggler", "straggler")
    blamed = [f for f in stragglers if f["ranks"] == [1]]
    assert blamed and all(f["step"] >= 20 for f in blamed)
    # A neighbour in the suite may slow another rank for a moment: named at info, never paged.
    assert [f["ranks"] for f in raised(stragglers) if f["ranks"] != [1]] == []


def test_mild_straggler_is_blamed_on_a_noisy_machine_on_default_settings(url, shared_http, tmp_path):
    # Four ranks time-sliced on two shared cores: each rank's compute_time jitters by 20-30 % from
    # step to step (measured), and the slow rank also loses its share of the cores, so its
    # measured ratio is 1.3x or more; the defaults must still name it.
    # 500 steps (about 5 s): the suite's load comes in bursts, and 250 steps could fall inside
    # one whose jitter hides a 1.3x rank (the fresh-clone CI failed twice so, with no finding).
    configure(shared_http, "e2e-straggler-mild")
    train(url, "e2e-straggler-mild", tmp_path, "--steps", "500", "--fault", "straggler",
          "--fault-rank", "1", "--fault-step", "20", "--slow-factor", "1.3")
    stragglers = findings(shared_http, "e2e-straggler-mild", "straggler")
    blamed = [f for f in stragglers if f["ranks"] == [1]]
    assert blamed and all(f["step"] >= 20 for f in blamed), [
        (f["step"], f["ranks"], f["severity"], f["evidence"].get("ratio")) for f in stragglers]
    assert blamed[0]["evidence"]["ratio"] > 1.1
    # Steps take about 10 ms here, so a neighbour in the suite that holds a core for half a second
    # truly slows another rank for tens of steps (seen in CI: rank 3 named too). That is the
    # severity policy's case (see ``raised``): named at ``info``, no page. Only the fault may page.
    assert [f["ranks"] for f in raised(stragglers) if f["ranks"] != [1]] == []


@pytest.fixture(scope="module")
def hung_run(url, shared_http, tmp_path_factory) -> list[dict]:
    """Rank 3 sleeps 25 s in its compute phase at step 40; its peers wait in the all-reduce. On
    default settings: the heartbeats show the split, so it is named after collective_wait_s (10 s),
    long before the generic silence timeout."""
    configure(shared_http, "e2e-hang")
    train(url, "e2e-hang", tmp_path_factory.mktemp("hang"), "--steps", "60", "--fault", "hang",
          "--fault-rank", "3", "--fault-step", "40", "--hang-s", "25", "--hang-where", "outside")
    return all_findings(shared_http, "e2e-hang")


def test_hung_rank_outside_the_collective_is_named(hung_run):
    stalls = [f for f in hung_run if f["kind"] == "stall" and f["status"] == "firing"]
    assert [(f["step"], f["evidence"]["culprits"]) for f in stalls] == [(40, [3])]
    culprits = [f for f in hung_run if f["kind"] == "hang" and f["status"] == "firing"
                and f["evidence"].get("culprit")]
    assert [(f["step"], f["ranks"]) for f in culprits] == [(40, [3])]


def test_ranks_waiting_in_the_collective_are_not_reported_hung(hung_run):
    assert [f["ranks"] for f in hung_run if f["kind"] == "hang" and f["status"] == "firing"] == [[3]]


@pytest.fixture(scope="module")
def corrupted_run(url, shared_http, tmp_path_factory) -> Path:
    """Rank 2's gradients are scaled and noised before the all-reduce from step 60 on."""
    workdir = tmp_path_factory.mktemp("corrupt")
    # A 4-rank job on default settings: each rank is judged against its own history among peers.
    configure(shared_http, "e2e-corrupt")
    train(url, "e2e-corrupt", workdir, "--steps", "100", "--fault", "corrupt_grad",
          "--fault-rank", "2", "--fault-step", "60", "--ckpt-every", "20")
    return workdir


def test_gradient_corruption_is_blamed_on_its_rank(corrupted_run, shared_http):
    outliers = findings(shared_http, "e2e-corrupt", "rank_outlier")
    blamed = [f for f in outliers if f["ranks"] == [2]]
    assert blamed and min(f["step"] for f in blamed) >= 60
    assert not [f for f in outliers if f["ranks"] and f["ranks"] != [2]]


def test_corruption_rollback_restarts_from_a_clean_checkpoint_and_continues_healthy(
        corrupted_run, url, shared_http):
    answer = shared_http.get("/v1/runs/e2e-corrupt/rollback")
    assert answer.status_code == 200, answer.text
    target = answer.json()["checkpoint"]
    assert target is not None and target["step"] < 60  # holds no corrupted update

    summary = train(url, "e2e-corrupt", corrupted_run, "--steps", "120", "--resume-from-rollback")
    assert summary["start_step"] == target["step"] + 1
    events = shared_http.get("/v1/runs/e2e-corrupt/events").json()
    assert [(e["kind"], e["step"]) for e in events if e["kind"] == "rollback"] == [("rollback", target["step"])]
    run = shared_http.get("/v1/runs/e2e-corrupt").json()
    assert run["attempt"] == 2 and run["status"] == "finished"
    new = [f for f in raised(all_findings(shared_http, "e2e-corrupt"))
           if f["attempt"] == 2 and f["status"] == "firing"]
    assert new == []

    # The loss is back on the clean trajectory: the same training without the fault (batches are
    # seeded by step and rank, so the runs see the same data) ends where the resumed run ends.
    train(url, "e2e-clean-ref", corrupted_run, "--steps", "120")

    def tail_loss(run_id: str) -> float:
        cols = shared_http.get(f"/v1/runs/{run_id}/metrics",
                               params={"step_min": 100, "step_max": 119, "fields": "loss"}).json()["columns"]
        return float(np.median(cols["loss"]))

    resumed, clean = tail_loss("e2e-corrupt"), tail_loss("e2e-clean-ref")
    assert abs(resumed - clean) / clean < 0.05, (resumed, clean)


def test_rank_leaving_restarts_with_fewer_ranks_without_a_false_alarm(url, shared_http, tmp_path):
    # Rank 3 dies at step 60; the survivors restart from the step-49 checkpoint and run ~300 more
    # steps; only the world-size change tells the service it is gone. On default settings the
    # training is shorter than the hang timeout (60 s): a silence beyond it is checked on a fake
    # clock by tests/service/test_monitor.py (test_a_rank_that_left_is_not_hung_...).
    configure(shared_http, "e2e-leave")
    summary = train(url, "e2e-leave", tmp_path, "--steps", "350", "--fault", "leave",
                    "--fault-rank", "3", "--fault-step", "60", "--ckpt-every", "25")
    assert summary["start_step"] == 50  # resumed after the newest checkpoint (step 49)
    events = shared_http.get("/v1/runs/e2e-leave/events").json()
    changes = [e for e in events if e["kind"] == "world_size_change"]
    assert len(changes) == 1 and (changes[0]["data"]["old"], changes[0]["data"]["new"]) == (4, 3)
    assert [e["step"] for e in events if e["kind"] == "restart"] == [49]
    run = shared_http.get("/v1/runs/e2e-leave").json()
    assert run["attempt"] == 2 and run["status"] == "finished"
    found = all_findings(shared_http, "e2e-leave")
    assert not [f for f in found if f["kind"] == "hang" and 3 in f["ranks"]]
    assert not [f for f in found if f["kind"] in ("hang", "stall") and f["attempt"] == 2
                and f["status"] == "firing"]
