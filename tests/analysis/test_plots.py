"""The plotting helpers draw what the data and the service's answers say: tests read back the
artists (data arrays, spans, gids), not pixels."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402

from healthsvc_client import plots  # noqa: E402
from healthsvc_client.read import Reader  # noqa: E402

F64 = pd.ArrowDtype(pa.float64())


def frame(steps: int = 60, ranks: int = 4, slow_rank: int = 2, slow_from: int = 20, seed: int = 0) -> pd.DataFrame:
    """A read-API-shaped history: rank ``slow_rank`` computes 3x slower from ``slow_from``."""
    rng = np.random.default_rng(seed)
    step = np.repeat(np.arange(steps), ranks)
    rank = np.tile(np.arange(ranks), steps)
    compute = 0.1 * (1 + 0.05 * rng.standard_normal(len(step)))
    compute[(rank == slow_rank) & (step >= slow_from)] *= 3
    loss = 3.0 - step / steps + 0.01 * rng.standard_normal(len(step))
    df = pd.DataFrame({"step": step, "rank": rank, "attempt": np.ones_like(step),
                       "loss": pd.array(loss, dtype=F64), "grad_norm": pd.array(np.full(len(step), 0.5), dtype=F64),
                       "local_grad_norm": pd.array(0.5 + 0.01 * rng.standard_normal(len(step)), dtype=F64),
                       "compute_time": pd.array(compute, dtype=F64),
                       "step_time": pd.array(np.full(len(step), 0.35), dtype=F64)})
    return df


def test_per_step_keeps_nan_and_skips_missing():
    df = frame(steps=3, ranks=2)
    vals = pa.array([1.0, 3.0, float("nan"), 2.0, None, 5.0], pa.float64())
    df["loss"] = pd.array(vals, dtype=F64)
    s = plots.per_step(df, "loss")
    assert s.loc[0, "median"] == 2.0 and s.loc[0, "min"] == 1.0 and s.loc[0, "max"] == 3.0
    assert np.isnan(s.loc[1, "median"])  # a NaN on one rank makes the step NaN: it is data
    assert s.loc[2, "median"] == 5.0      # a missing value is skipped


def test_heatmap_makes_the_straggler_a_bright_row():
    fig, ax = plt.subplots()
    plots.rank_heatmap(frame(), "compute_time", ax=ax)
    img = ax.collections[0].get_array().reshape(4, 60)  # ranks x steps, relative to the step median
    assert img[2, 20:].mean() > 2.0
    assert abs(img[[0, 1, 3], :].mean() - 1.0) < 0.1 and img[2, :20].mean() < 1.2
    plt.close(fig)


def test_heatmap_leaves_missing_cells_blank():
    df = frame(steps=5, ranks=2)
    df = df[~((df.step == 3) & (df["rank"] == 1))]
    fig, ax = plt.subplots()
    plots.rank_heatmap(df, "compute_time", ax=ax, relative=False)
    arr = ax.collections[0].get_array().reshape(2, 5)
    assert np.ma.getmaskarray(arr)[1, 3] and np.ma.getmaskarray(arr).sum() == 1
    plt.close(fig)


def test_run_overview_marks_findings_checkpoints_and_restarts():
    findings = pd.DataFrame([{"kind": "straggler", "step": 24, "status": "firing"},
                             {"kind": "straggler", "step": 50, "status": "resolved"}])
    checkpoints = pd.DataFrame({"step": [19, 39, 59], "status": ["ok", "ok", "deleted"]})
    timeline = pd.DataFrame([{"kind": "attempt_started", "step": 0, "attempt": 1, "is_restart": False, "world_size": 4},
                             {"kind": "attempt_started", "step": 40, "attempt": 2, "is_restart": True, "world_size": 3}])
    fig = plots.run_overview(frame(), findings, checkpoints, timeline, title="t")
    gids = plots.gids(fig)
    assert gids.count("finding:straggler:24") == 2 and "finding:straggler:50" not in gids  # firing only, 2 panels
    assert gids.count("attempt:2:40") == 2 and not [g for g in gids if g.startswith("attempt:1")]
    ck = [a for a in fig.findobj() if a.get_gid() == "checkpoints"][0]
    assert ck.get_offsets()[:, 0].tolist() == [19, 39]
    assert len(fig.axes) == 4  # three panels and the heatmap's colour bar
    plt.close(fig)


def test_run_overview_draws_each_attempt_underneath():
    effective = frame()
    older = frame(seed=1).assign(attempt=1)
    older = older[older.step >= 30].assign(loss=lambda d: d["loss"] + 5)
    fig = plots.run_overview(effective, all_attempts=older)
    curve = [a for a in fig.axes[0].lines if a.get_gid() == "attempt-curve:loss:1"][0]
    assert curve.get_xdata().min() == 30 and np.nanmin(curve.get_ydata()) > 5
    plt.close(fig)


def test_incident_draws_onset_interval_target_and_blamed_rank():
    answer = {"run_id": "x", "checkpoint": {"step": 19}, "onset": {"step": 31, "low": 29, "high": 33, "ranks": [2]}}
    fig = plots.plot_incident(frame(), answer, pd.DataFrame({"step": [19, 39]}), None, window=(10, 50))
    span = [a for a in fig.axes[0].patches if a.get_gid() == "onset-interval"][0]
    assert (span.get_x(), span.get_x() + span.get_width()) == (28.5, 33.5)
    target = [a for a in fig.axes[0].lines if a.get_gid() == "rollback-target"][0]
    assert target.get_xdata()[0] == 19
    blamed = [a for a in fig.axes[0].lines if a.get_gid() == "rank:2"][0]
    assert blamed.get_linewidth() > [a for a in fig.axes[0].lines if a.get_gid() == "rank:0"][0].get_linewidth()
    assert blamed.get_xdata().min() >= 10 and blamed.get_xdata().max() <= 50
    plt.close(fig)


def test_bisection_probes_in_report_order():
    state = {"reports": [{"step": 59, "good": False}, {"step": 19, "good": True}, {"step": 39, "good": True}],
             "last_good": {"step": 39}, "first_bad": {"step": 59}}
    fig, ax = plt.subplots()
    plots.plot_bisection(state, pd.DataFrame({"step": [19, 39, 59]}), ax=ax)
    assert [g for g in plots.gids(fig) if g.startswith("probe:")] == ["probe:59:bad", "probe:19:good", "probe:39:good"]
    plt.close(fig)


@pytest.fixture(scope="module")
def economics(shared_server, shared_http):
    """A small real run: attempt 1 steps 0..29 (4 ranks), checkpoint 19, attempt 2 resumes at 20 with 3 ranks."""
    run = "plots-econ"
    assert shared_http.put(f"/v1/runs/{run}", json={"world_size": 4, "batch_size_per_rank": 8}).status_code == 200

    def push(steps, ranks):
        cols = {"step": [s for s in steps for _ in ranks], "rank": [r for _ in steps for r in ranks],
                "loss": [1.0] * (len(steps) * len(ranks)), "step_time": [0.1] * (len(steps) * len(ranks)),
                "world_size": [len(ranks)] * (len(steps) * len(ranks))}
        assert shared_http.post(f"/v1/runs/{run}/metrics", content=json.dumps({"columns": cols}),
                                headers={"content-type": "application/json"}).status_code == 202

    push(range(0, 20), range(4))
    assert shared_http.post(f"/v1/runs/{run}/checkpoints", json={"step": 19, "uri": "u19", "duration_s": 0.2}).status_code == 201
    push(range(20, 30), range(4))
    push(range(20, 40), range(3))
    r = Reader(shared_server.url)
    return r.timeline(run), r.goodput(run), r.advice(run), r.retention(run)


def test_economics_overview_draws_the_service_answers(economics):
    timeline, goodput, advice, plan = economics
    fig = plots.economics_overview(timeline, goodput, advice, plan, title="e")
    gids = plots.gids(fig)
    assert [g for g in gids if g.startswith("attempt-bar:")] == ["attempt-bar:1", "attempt-bar:2"]
    assert "world-size-change" in gids
    assert [g for g in gids if g.startswith("retention:")] == [f"retention:{c['step']}:{c['action']}" for c in plan["checkpoints"]]
    widths = {p.get_gid(): p.get_width() for p in fig.findobj() if (p.get_gid() or "").startswith("goodput:")}
    assert widths["goodput:productive_s"] == pytest.approx(goodput["productive_s"])
    assert widths["goodput:recompute_s"] == pytest.approx(goodput["recompute_s"]) and goodput["recompute_s"] > 0
    plt.close(fig)


def test_the_timeline_says_who_restarted_the_run_why_and_without_which_hosts():
    decision = {"decided_by": "healthsvc supervise", "reason_code": "finding", "from_attempt": 1,
                "checkpoint_step": 19, "checkpoint_uri": "file:///ckpt/19", "exclude_hosts": ["node2"],
                "old_world_size": 4, "new_world_size": 3, "causes": [{"kind": "replica_mismatch", "step": 24}]}
    timeline = pd.DataFrame([
        {"kind": "attempt_started", "at_s": 100.0, "step": 0, "attempt": 1, "world_size": 4},
        {"kind": "event", "at_s": 130.0, "step": 19, "attempt": 1, "event_kind": "rollback", "decision": decision},
        {"kind": "event", "at_s": 131.0, "step": 20, "attempt": 1, "event_kind": "note", "decision": None},
        {"kind": "attempt_ended", "at_s": 131.0, "step": 25, "attempt": 1},
        {"kind": "attempt_started", "at_s": 135.0, "step": 20, "attempt": 2, "world_size": 3},
    ])
    ax = plots.plot_timeline(timeline)
    texts = {a.get_text(): a.get_gid() for a in ax.texts}
    label = ("rollback by healthsvc supervise (finding: replica_mismatch)\n"
             "from step 19, without node2, 4->3 ranks")
    assert texts[label] == "supervised-restart:19" and texts["note"] is None
    plt.close(ax.figure)
