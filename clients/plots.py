"""Plots for the analyst notebooks: matplotlib figures from the DataFrames of :mod:`healthsvc_client.read`.

Each function draws what the service returned and computes nothing the service did not decide:
the lines are the run's per-step values (aggregated over ranks where noted), the markers are its
findings, checkpoints, attempts, onset estimate and plans. matplotlib (and pandas/numpy) are
imported inside the functions, so ``import healthsvc_client`` stays light. Every function takes an optional
``ax`` and returns the Axes (or a Figure for the composite ones), for tests and further styling.

    from healthsvc_client import plots, read
    fig = plots.run_overview(read.metrics(run), read.findings(run), read.checkpoints(run), read.timeline(run))
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def kind_colour(kind: str) -> str:
    """The colour a finding kind is drawn in, as its kind declares it (:mod:`healthsvc_detectors.kinds`, which
    the service distribution ships); black for a kind this installation does not know (a newer
    service's), and for every kind where only the client is installed.

    >>> kind_colour("non_finite"), kind_colour("no_such_kind")
    ('#d62728', 'k')
    """
    try:
        from healthsvc_detectors import kinds   # numpy comes with it: imported on use, like matplotlib
    except ImportError:               # the client alone: the service's kind declarations are not here
        return "k"
    return kinds.kind(kind).colour if kinds.known(kind) else "k"


def _plt():
    try:
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as exc:
        from healthsvc_client.read import ANALYSIS_EXTRA
        raise ModuleNotFoundError(f"{__name__} draws with matplotlib; {exc.name} is missing, the client "
                                  f"installs without the analysis stack: {ANALYSIS_EXTRA}", name=exc.name) from exc
    return plt


def _floats(series) -> Any:
    """A float numpy array: missing (NA) and NaN both become NaN — for drawing only."""
    import numpy as np
    return series.to_numpy(dtype=float, na_value=np.nan)


def per_step(metrics: "pd.DataFrame", field: str) -> "pd.DataFrame":
    """Median, min and max over ranks of ``field`` per step (index: step). NaN counts as a value
    (the step is then NaN), a missing value is skipped."""
    import numpy as np
    import pandas as pd
    values = _floats(metrics[field])
    reported = ~metrics[field].isna().to_numpy()
    df = pd.DataFrame({"step": metrics["step"].to_numpy()[reported], "v": values[reported]})
    g = df.groupby("step")["v"]
    out = pd.DataFrame({"median": g.median(skipna=False), "min": g.min(skipna=False), "max": g.max(skipna=False)})
    out["median"] = out["median"].where(np.isfinite(out["median"]) | out["median"].isna(), np.nan)
    return out


def plot_metric(metrics: "pd.DataFrame", field: str, *, ax: "Axes | None" = None, log: bool = False,
                label: str | None = None, color: str = "C0") -> "Axes":
    """``field`` per step: the median over ranks as a line, the min..max band over ranks shaded."""
    ax = ax or _plt().gca()
    s = per_step(metrics, field)
    ax.plot(s.index, s["median"], color=color, lw=1.2, label=label or f"{field} (median over ranks)")
    ax.fill_between(s.index, s["min"], s["max"], color=color, alpha=0.2, lw=0)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(field)
    return ax


def mark_findings(ax: "Axes", findings: "pd.DataFrame", *, status: str = "firing", label: bool = True) -> "Axes":
    """A vertical line at each finding's step, coloured by kind (one legend entry per kind)."""
    if findings is None or len(findings) == 0:
        return ax
    seen: set[str] = set()
    for row in findings.itertuples():
        if status and row.status != status:
            continue
        kind = row.kind
        ax.axvline(row.step, color=kind_colour(kind), lw=1.0, ls="--", alpha=0.8,
                   label=kind if label and kind not in seen else None, gid=f"finding:{kind}:{row.step}")
        seen.add(kind)
    return ax


def mark_checkpoints(ax: "Axes", checkpoints: "pd.DataFrame", *, label: bool = True) -> "Axes":
    """A small triangle on the top edge at each checkpoint's step (grey if deleted or bad)."""
    if checkpoints is None or len(checkpoints) == 0:
        return ax
    trans = ax.get_xaxis_transform()
    good = checkpoints[~checkpoints["status"].isin(["deleted", "bad"])]
    other = checkpoints[checkpoints["status"].isin(["deleted", "bad"])]
    ax.scatter(good["step"], [1.0] * len(good), marker="v", color="k", s=18, transform=trans, clip_on=False,
               label="checkpoint" if label else None, gid="checkpoints", zorder=5)
    if len(other):
        ax.scatter(other["step"], [1.0] * len(other), marker="v", color="0.7", s=18, transform=trans,
                   clip_on=False, gid="checkpoints-unusable", zorder=5)
    return ax


def mark_attempts(ax: "Axes", timeline: "pd.DataFrame", *, label: bool = True) -> "Axes":
    """A solid line where each attempt after the first resumed (a restart or a rollback), with
    the attempt number and its world size."""
    if timeline is None or len(timeline) == 0:
        return ax
    starts = timeline[(timeline["kind"] == "attempt_started")]
    first = True
    for row in starts.itertuples():
        if not bool(getattr(row, "is_restart", False)):
            continue
        ax.axvline(row.step, color="k", lw=1.5, alpha=0.7, label="restart (new attempt)" if label and first else None,
                   gid=f"attempt:{row.attempt}:{row.step}")
        ws = getattr(row, "world_size", None)
        text = f"attempt {row.attempt}" + (f"\n{ws} ranks" if ws is not None and ws == ws else "")
        ax.text(row.step, 0.97, text, transform=ax.get_xaxis_transform(), fontsize=7, va="top", ha="left")
        first = False
    return ax


def rank_heatmap(metrics: "pd.DataFrame", field: str = "compute_time", *, ax: "Axes | None" = None,
                 relative: bool = True, cmap: str = "magma") -> "Axes":
    """Ranks x steps image of ``field``. With ``relative``, each step is divided by its median over
    ranks, so a rank that is consistently slower than its peers shows as a bright row (a
    straggler) whatever the job's overall pace. Missing cells are blank."""
    import numpy as np
    plt = _plt()
    ax = ax or plt.gca()
    wide = metrics.assign(_v=_floats(metrics[field])).pivot_table(index="rank", columns="step", values="_v",
                                                                 aggfunc="last", dropna=False)
    img = wide.to_numpy(dtype=float)
    if relative:
        with np.errstate(all="ignore"):
            img = img / np.nanmedian(img, axis=0, keepdims=True)
    steps, ranks = wide.columns.to_numpy(), wide.index.to_numpy()
    mesh = ax.pcolormesh(steps, ranks, np.ma.masked_invalid(img), cmap=cmap, shading="nearest",
                         vmin=np.nanmin(img) if not relative else 0.5, vmax=None if not relative else 3.0)
    ax.figure.colorbar(mesh, ax=ax, label=f"{field} / median over ranks" if relative else field, pad=0.01)
    ax.set_ylabel("rank")
    ax.set_yticks(ranks)
    ax.invert_yaxis()
    return ax


def run_overview(metrics: "pd.DataFrame", findings: "pd.DataFrame | None" = None,
                 checkpoints: "pd.DataFrame | None" = None, timeline: "pd.DataFrame | None" = None, *,
                 all_attempts: "pd.DataFrame | None" = None, heatmap_field: str | None = None,
                 title: str | None = None) -> "Figure":
    """Loss, gradient norm (log) and the per-rank time heatmap on one step axis, with findings,
    checkpoints and restarts marked. ``all_attempts`` (``read.metrics(run, attempt="all")``) adds
    each attempt's own curve in grey underneath: where a later attempt redid steps, the abandoned
    branch shows (e.g. the corrupted stretch before a rollback). The heatmap shows ``compute_time`` when reported (in a
    synchronous job every rank's ``step_time`` is about the same: the straggler shows in its
    compute time), else ``step_time``."""
    plt = _plt()
    field = heatmap_field or ("compute_time" if "compute_time" in metrics.columns else "step_time")
    fig, axes = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True, gridspec_kw={"height_ratios": [3, 3, 2]},
                             layout="constrained")
    for ax, name in zip(axes[:2], ("loss", "grad_norm")):
        if all_attempts is None or name not in all_attempts.columns:
            continue
        for i, (attempt, part) in enumerate(all_attempts.groupby("attempt")):
            s = per_step(part, name)
            ax.plot(s.index, s["median"], color="0.6", lw=1.0, ls="-", gid=f"attempt-curve:{name}:{attempt}",
                    label="abandoned branch (earlier attempt)" if i == 0 and ax is axes[0] else None)
    plot_metric(metrics, "loss", ax=axes[0], color="C0")
    if "grad_norm" in metrics.columns:
        plot_metric(metrics, "grad_norm", ax=axes[1], log=True, color="C2")
    for ax in axes[:2]:
        mark_findings(ax, findings, label=ax is axes[0])
        mark_checkpoints(ax, checkpoints, label=ax is axes[0])
        mark_attempts(ax, timeline, label=ax is axes[0])
    axes[0].legend(loc="lower left", fontsize=7, ncol=2)
    if field in metrics.columns:
        rank_heatmap(metrics, field, ax=axes[2])
    axes[2].set_xlabel("step")
    if title:
        fig.suptitle(title)
    return fig


def findings_table(findings: "pd.DataFrame") -> "pd.DataFrame":
    """The findings as a compact table for display: kind, step, onset, ranks, severity, score, status."""
    cols = ["attempt", "kind", "step", "onset_step", "ranks", "hosts", "metric", "severity", "score", "status"]
    return findings[[c for c in cols if c in findings.columns]].reset_index(drop=True)


# ---- incident --------------------------------------------------------------------------------------

def plot_incident(metrics: "pd.DataFrame", rollback: dict[str, Any], checkpoints: "pd.DataFrame | None" = None,
                  findings: "pd.DataFrame | None" = None, *, field: str = "local_grad_norm",
                  window: tuple[int, int] | None = None) -> "Figure":
    """One corruption incident: the per-rank ``field`` (blamed ranks highlighted) and the loss, with
    the onset estimate (point and interval), the findings, the recommended checkpoint and the
    checkpoints ruled out (after the onset or of an abandoned branch)."""
    import numpy as np
    plt = _plt()
    onset = rollback.get("onset") or {}
    target = rollback.get("checkpoint")
    blamed = set(onset.get("ranks") or [])
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, layout="constrained")
    m = metrics
    if window is not None:
        m = metrics[(metrics["step"] >= window[0]) & (metrics["step"] <= window[1])]
    ax = axes[0]
    if field in m.columns:
        for rank, part in m.groupby("rank"):
            hot = rank in blamed
            ax.plot(part["step"], _floats(part[field]), lw=1.6 if hot else 0.8, alpha=1.0 if hot else 0.6,
                    color="C3" if hot else "0.5", label=f"rank {rank}" + (" (blamed)" if hot else ""),
                    gid=f"rank:{rank}")
        ax.set_yscale("log")
        ax.set_ylabel(field)
    plot_metric(m, "loss", ax=axes[1])
    for ax in axes:
        if onset.get("step") is not None:
            ax.axvspan(onset["low"] - 0.5, onset["high"] + 0.5, color="C1", alpha=0.25, gid="onset-interval",
                       label=f"onset interval {onset['low']}..{onset['high']}")
            ax.axvline(onset["step"], color="C1", lw=2, gid="onset", label=f"onset estimate {onset['step']}")
        mark_findings(ax, findings, label=ax is axes[0])
        if checkpoints is not None and len(checkpoints):
            steps = checkpoints["step"].to_numpy()
            if window is not None:
                steps = steps[(steps >= window[0]) & (steps <= window[1])]
            for s in np.unique(steps):
                ax.axvline(s, color="0.85", lw=0.8, zorder=0)
        if target:
            ax.axvline(target["step"], color="C2", lw=2.5, gid="rollback-target",
                       label=f"resume from checkpoint {target['step']}")
    axes[0].legend(loc="upper left", fontsize=7, ncol=2)
    axes[1].set_xlabel("step")
    fig.suptitle(f"{rollback.get('run_id', '')}: onset and rollback target")
    return fig


def plot_bisection(state: dict[str, Any], checkpoints: "pd.DataFrame", *, ax: "Axes | None" = None) -> "Axes":
    """The bisection's probes on the checkpoint axis: good (green) and bad (red), numbered in the
    order they were reported, with the final boundary."""
    ax = ax or _plt().gca()
    ax.scatter(checkpoints["step"], [0] * len(checkpoints), marker="|", s=200, color="0.6", label="checkpoint")
    for i, rep in enumerate(state.get("reports") or [], start=1):
        good = rep.get("good")
        ax.scatter([rep["step"]], [0], s=120, color="C2" if good else "C3", zorder=3,
                   gid=f"probe:{rep['step']}:{'good' if good else 'bad'}",
                   label=("good" if good else "bad") + " probe")
        ax.annotate(str(i), (rep["step"], 0), textcoords="offset points", xytext=(0, 9), ha="center", fontsize=8)
    for key, color in (("last_good", "C2"), ("first_bad", "C3")):
        point = state.get(key)
        if point:
            step = point["step"] if isinstance(point, dict) else point
            ax.axvline(step, color=color, ls=":", label=f"{key.replace('_', ' ')}: {step}")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left")
    ax.set_yticks([])
    ax.set_xlabel("checkpoint step")
    return ax


# ---- economics -------------------------------------------------------------------------------------

def supervised_label(event_kind: str, decision: dict[str, Any]) -> str:
    """What a supervised restart's marker says: who decided, why, from which checkpoint, which
    hosts were left out and how the world changed (the timeline entry's ``decision``).

    >>> print(supervised_label("rollback", {"decided_by": "healthsvc supervise", "reason_code": "finding",
    ...       "checkpoint_step": 19, "exclude_hosts": ["node2"], "old_world_size": 4, "new_world_size": 3,
    ...       "causes": [{"kind": "replica_mismatch", "step": 24}]}))
    rollback by healthsvc supervise (finding: replica_mismatch)
    from step 19, without node2, 4->3 ranks
    """
    causes = ", ".join(str(c.get("kind")) for c in decision.get("causes") or [])
    head = f"{event_kind} by {decision.get('decided_by')} ({decision.get('reason_code')}"
    head += f": {causes})" if causes else ")"
    tail = f"from step {decision.get('checkpoint_step')}"
    if decision.get("exclude_hosts"):
        tail += ", without " + ", ".join(decision["exclude_hosts"])
    old, new = decision.get("old_world_size"), decision.get("new_world_size")
    if old is not None and new is not None and old != new:
        tail += f", {old}->{new} ranks"
    return head + "\n" + tail


def plot_timeline(timeline: "pd.DataFrame", *, ax: "Axes | None" = None) -> "Axes":
    """The run in wall time: one bar per attempt (labelled with its world size), checkpoint writes
    as ticks, findings and events as markers (a supervised restart says who decided, why, from
    which checkpoint and without which hosts), world-size changes annotated."""
    import numpy as np
    ax = ax or _plt().gca()
    t0 = float(np.nanmin(timeline["at_s"].to_numpy(dtype=float)))
    rel = timeline.assign(t=timeline["at_s"].astype(float) - t0)
    starts = rel[rel["kind"] == "attempt_started"].set_index("attempt")["t"]
    ends = rel[rel["kind"] == "attempt_ended"].set_index("attempt")["t"]
    ws = rel[rel["kind"] == "attempt_started"].set_index("attempt").get("world_size")
    for a, t_start in starts.items():
        t_end = ends.get(a, rel["t"].max())
        ax.barh(0, t_end - t_start, left=t_start, height=0.5, color=f"C{int(a) % 10}", alpha=0.5,
                edgecolor="k", gid=f"attempt-bar:{a}")
        label = f"attempt {a}" + (f" ({ws[a]} ranks)" if ws is not None and ws.get(a) == ws.get(a) else "")
        ax.text(t_start + 0.3, 0, label, va="center", fontsize=7)
    ck = rel[rel["kind"] == "checkpoint"]
    ax.scatter(ck["t"], [0.45] * len(ck), marker="v", color="k", s=20, label="checkpoint write", gid="timeline-ckpt")
    fi = rel[rel["kind"] == "finding"]
    for kind, part in fi.groupby("finding_kind") if len(fi) else []:
        ax.scatter(part["t"], [-0.45] * len(part), marker="o", s=25, color=kind_colour(kind), label=kind)
    ev = rel[rel["kind"] == "event"]
    for row in ev.itertuples():
        decision = getattr(row, "decision", None)
        text, gid = str(row.event_kind), None
        if isinstance(decision, dict):   # decided by a supervisor: say who, why, from where
            text, gid = supervised_label(text, decision), f"supervised-restart:{decision.get('checkpoint_step')}"
        ax.annotate(text, (row.t, 0.3), xytext=(0, 18), textcoords="offset points", fontsize=7, ha="center",
                    arrowprops={"arrowstyle": "-", "lw": 0.5}, gid=gid)
    for row in rel[rel["kind"] == "world_size_change"].itertuples():
        text = f"world size {row.old_world_size}->{row.new_world_size}"
        if getattr(row, "new_effective_batch_size", None) is not None and row.new_effective_batch_size == row.new_effective_batch_size:
            text += f"\nbatch {row.old_effective_batch_size}->{row.new_effective_batch_size}"
        ax.annotate(text, (row.t, -0.3), xytext=(0, -28), textcoords="offset points", fontsize=7, ha="center",
                    arrowprops={"arrowstyle": "-", "lw": 0.5}, gid="world-size-change")
    ax.set_ylim(-1, 1)
    ax.set_yticks([])
    ax.set_xlabel("seconds since the run started (service clock)")
    ax.legend(fontsize=7, loc="upper right", ncol=3)
    return ax


def plot_goodput(goodput: dict[str, Any], *, ax: "Axes | None" = None) -> "Axes":
    """One stacked bar: the run's wall time split by use (seconds), the goodput fraction in the title."""
    ax = ax or _plt().gca()
    parts = [("productive_s", "productive", "C2"), ("checkpoint_s", "checkpoint writes", "C0"),
             ("downtime_s", "restarts (down)", "C7"), ("recompute_s", "recomputed", "C1"),
             ("corrupted_progress_s", "corrupted progress", "C3"), ("unaccounted_s", "unaccounted", "0.85")]
    left = 0.0
    for key, label, color in parts:
        width = max(0.0, float(goodput.get(key) or 0.0))
        ax.barh(0, width, left=left, color=color, label=f"{label}: {width:.1f} s", gid=f"goodput:{key}")
        left += width
    ax.set_yticks([])
    ax.set_xlabel("wall time, s")
    ax.set_title(f"goodput {goodput.get('goodput_fraction', 0.0):.0%} of {goodput.get('wall_s', 0.0):.1f} s wall time")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3)
    return ax


def plot_intervals(advice: dict[str, Any], *, ax: "Axes | None" = None) -> "Axes":
    """The current checkpoint interval next to the Young and Daly optima (seconds), each labelled
    with its expected overhead (share of wall time not spent on useful work)."""
    ax = ax or _plt().gca()
    overhead = advice.get("overhead") or {}
    bars = [("Young", advice.get("young_interval_s"), overhead.get("young")),
            ("Daly", advice.get("daly_interval_s"), overhead.get("daly")),
            ("current", advice.get("current_interval_s"), overhead.get("current"))]
    names = [b[0] for b in bars if b[1] is not None]
    values = [b[1] for b in bars if b[1] is not None]
    rects = ax.bar(names, values, color=["C0", "C1", "C3"][:len(values)])
    for rect, (_, _, ov) in zip(rects, [b for b in bars if b[1] is not None]):
        if ov is not None:
            ax.annotate(f"overhead {ov:.1%}", (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                        xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("checkpoint interval, s")
    return ax


def plot_retention(plan: dict[str, Any], *, ax: "Axes | None" = None) -> "Axes":
    """The retention plan on the step axis: kept checkpoints (green) and deletable ones (grey), each
    labelled with its reasons, and the lag window the plan covers."""
    ax = ax or _plt().gca()
    rows = plan.get("checkpoints") or []
    for row in rows:
        keep = row["action"] == "keep"
        ax.scatter([row["step"]], [1 if keep else 0], s=60, color="C2" if keep else "0.6",
                   marker="o" if keep else "x", gid=f"retention:{row['step']}:{row['action']}")
        ax.annotate(", ".join(row.get("reasons") or []), (row["step"], 1 if keep else 0), xytext=(0, 8),
                    textcoords="offset points", rotation=60, fontsize=6, ha="left")
    window = plan.get("lag_window_steps")
    current = plan.get("current_step")
    if window and current is not None:
        ax.axvspan(current - window, current, color="C1", alpha=0.12, label=f"lag window ({window} steps)")
        ax.legend(fontsize=7, loc="lower left")
    ax.set_yticks([0, 1], ["delete", "keep"])
    ax.set_ylim(-0.5, 2.2)
    ax.set_xlabel("checkpoint step")
    return ax


def economics_overview(timeline: "pd.DataFrame", goodput: dict[str, Any], advice: dict[str, Any],
                       plan: dict[str, Any], *, title: str | None = None) -> "Figure":
    """Timeline, goodput, intervals and retention plan in one figure."""
    plt = _plt()
    fig = plt.figure(figsize=(11, 9), layout="constrained")
    grid = fig.add_gridspec(3, 2, height_ratios=[2, 1.2, 2])
    plot_timeline(timeline, ax=fig.add_subplot(grid[0, :]))
    plot_goodput(goodput, ax=fig.add_subplot(grid[1, :]))
    plot_intervals(advice, ax=fig.add_subplot(grid[2, 0]))
    plot_retention(plan, ax=fig.add_subplot(grid[2, 1]))
    if title:
        fig.suptitle(title)
    return fig


def gids(fig_or_ax) -> list[str]:
    """The ``gid`` of every artist drawn (what tests read to check what a plot shows)."""
    fig = getattr(fig_or_ax, "figure", fig_or_ax)
    return [a.get_gid() for a in fig.findobj() if a.get_gid()]


__all__: Sequence[str] = [
    "kind_colour", "supervised_label", "per_step", "plot_metric", "mark_findings", "mark_checkpoints", "mark_attempts",
    "rank_heatmap", "run_overview", "findings_table", "plot_incident", "plot_bisection", "plot_timeline",
    "plot_goodput", "plot_intervals", "plot_retention", "economics_overview", "gids",
]
