"""Record a small real run for the notebooks: examples/train.py against a temporary real server,
with a straggler, a silent gradient corruption with a rollback, and an elastic leave; then export
what the service holds into ``notebooks/data/`` (see healthsvc/replay.py for the format).

    .venv/bin/python examples/record_run.py [--out notebooks/data] [--figure docs/img/run_overview.png]

The story, in four launches of the trainer (4 gloo ranks on the CPU; about a minute):

1. steps 0-79: rank 1 straggles (3x its compute time) from step 30 on; the operator drains its
   node after step 79 and resumes from the newest checkpoint (a ``restart`` event);
2. steps 80-179: rank 2's gradients are silently corrupted from step 130 on (``corrupt_grad``);
3. ``--resume-from-rollback``: the service names the last clean checkpoint and training resumes
   after it (attempt 2, a ``rollback`` event), to step 199;
4. resumed from checkpoint 199, rank 3 dies at step 210 and the job restarts elastically with 3
   ranks from the newest checkpoint (attempt 3, ``restart`` and ``world_size_change`` events), to
   step 249.

Checkpoints every 20 steps. Re-running overwrites the recording (the numbers differ a little:
timings are real).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from healthsvc.replay import export_run  # noqa: E402
from healthsvc.local_server import LocalServer  # noqa: E402

RUN_ID = "demo-gpt-4r"
CONFIG = {
    "world_size": 4,
    "batch_size_per_rank": 8,
    # The hang timeout stays above the restart gap (importing torch, starting gloo).
    "detectors": {"hang": {"timeout_floor_s": 15.0}},
    "tags": {"model": "char-gpt-30k", "source": "examples/record_run.py"},
}
CKPT_EVERY = 20


def launches(ckpt_dir: Path) -> list[dict]:
    common = ["--ckpt-every", str(CKPT_EVERY), "--ckpt-dir", str(ckpt_dir), "--log-every", "0", "--heartbeat-s", "0.5"]
    return [
        {"why": "rank 1 straggles from step 30 (3x compute)", "fault": {"kind": "straggler", "rank": 1, "step": 30},
         "args": ["--steps", "80", "--fault", "straggler", "--fault-rank", "1", "--fault-step", "30",
                  "--slow-factor", "3", *common]},
        {"why": "slow node drained; resumed from checkpoint 79; rank 2's gradients silently corrupted from step 130",
         "fault": {"kind": "corrupt_grad", "rank": 2, "step": 130},
         "before": {"kind": "restart", "step": 79, "data": {"reason": "drained the slow node of rank 1"}},
         "args": ["--steps", "180", "--resume", str(ckpt_dir / "ckpt_000079.pt"), "--fault", "corrupt_grad",
                  "--fault-rank", "2", "--fault-step", "130", *common]},
        {"why": "rollback: resume after the checkpoint the service names, to step 199",
         "fault": None,
         "args": ["--steps", "200", "--resume-from-rollback", *common]},
        # A separate launch for the leave: train.py's elastic restart keeps --resume-from-rollback,
        # so a leave in the rollback launch would post a second, spurious rollback event.
        {"why": "resumed from checkpoint 199; rank 3 dies at step 210, elastic restart with 3 ranks",
         "fault": {"kind": "leave", "rank": 3, "step": 210},
         "args": ["--steps", "250", "--resume", str(ckpt_dir / "ckpt_000199.pt"), "--fault", "leave",
                  "--fault-rank", "3", "--fault-step", "210", *common]},
    ]


def wait_for_findings(http: httpx.Client, run_id: str, settle_s: float = 3.0) -> list[dict]:
    last, deadline = None, time.monotonic() + 20
    while time.monotonic() < deadline:
        found = http.get(f"/v1/runs/{run_id}/findings", params={"limit": 100000}).json()
        if last is not None and len(found) == len(last):
            return found
        last = found
        time.sleep(settle_s)
    return last or []


def record(out_dir: Path, workdir: Path) -> dict:
    with LocalServer(workdir / "record.db") as server, httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.put(f"/v1/runs/{RUN_ID}", json=CONFIG).status_code == 200
        done = []
        for launch in launches(workdir / "ckpt"):
            if "before" in launch:
                assert http.post(f"/v1/runs/{RUN_ID}/events", json=launch["before"]).status_code == 201
            cmd = [sys.executable, str(REPO / "examples" / "train.py"), "--url", server.url, "--run-id", RUN_ID,
                   *launch["args"]]
            started = time.time()
            result = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=600)
            if result.returncode != 0:
                raise SystemExit(f"trainer failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
            summary = [json.loads(x) for x in result.stdout.splitlines() if x.startswith('{"done"')][-1]
            print(f"{launch['why']}: {time.time() - started:.1f} s; {json.dumps(summary)[:160]}", flush=True)
            rollback = [x for x in result.stdout.splitlines() if x.startswith("rollback target:")]
            done.append({"why": launch["why"], "fault": launch["fault"],
                         "argv": ["examples/train.py", *[a if not a.startswith(str(workdir)) else
                                                         a.replace(str(workdir), "$WORKDIR") for a in launch["args"]]],
                         "started_at": started, "finished": True, "finished_at": time.time(),
                         "start_step": summary["start_step"], "steps": summary["steps"],
                         "rollback_target": json.loads(rollback[0].split(":", 1)[1]) if rollback else None})
        found = wait_for_findings(http, RUN_ID)
        manifest = {
            "recorded_by": "examples/record_run.py", "recorded_at": time.time(),
            "story": __doc__.split("\n\n")[2].strip(), "launches": done,
            "findings_when_recorded": [{k: f[k] for k in ("kind", "step", "ranks", "attempt", "status", "onset_step")}
                                       for f in found],
        }
        export_run(server.url, RUN_ID, out_dir, manifest)
        return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "notebooks" / "data"))
    parser.add_argument("--figure", default=str(REPO / "docs" / "img" / "run_overview.png"),
                        help="also render the run-overview figure from the recording ('' to skip)")
    parser.add_argument("--figure-only", action="store_true", help="only render the figure from --out")
    args = parser.parse_args(argv)
    if args.figure_only:
        render_figure(args.out, args.figure)
        print(f"wrote {args.figure}")
        return 0
    with tempfile.TemporaryDirectory(prefix="record-run-") as tmp:
        manifest = record(Path(args.out), Path(tmp))
    sizes = {p.name: p.stat().st_size for p in Path(args.out).iterdir()}
    print(f"wrote {args.out}: {sizes}; {len(manifest['findings_when_recorded'])} findings when recorded")
    if args.figure:
        render_figure(args.out, args.figure)
        print(f"wrote {args.figure}")
    return 0


def render_figure(data_dir: str, figure_path: str) -> None:
    """The README's figure: the run-overview plot of the recording, replayed into a fresh service."""
    import matplotlib
    matplotlib.use("Agg")
    from healthsvc_client import plots, read
    from healthsvc.replay import connect_or_serve

    svc = connect_or_serve(data_dir, url="")
    try:
        r = read.Reader(svc.url)
        fig = plots.run_overview(r.metrics(svc.run_id), r.findings(svc.run_id), r.checkpoints(svc.run_id),
                                 r.timeline(svc.run_id, findings=False),
                                 all_attempts=r.metrics(svc.run_id, fields=["loss", "grad_norm"], attempt="all"),
                                 title=svc.run_id)
        Path(figure_path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(figure_path, dpi=110)
    finally:
        svc.stop()


if __name__ == "__main__":
    sys.exit(main())
