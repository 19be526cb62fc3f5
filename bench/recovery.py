"""Recovery from a silent corruption: ``healthsvc supervise`` against the naive restart.

One run of the example trainer (examples/train.py, 4 gloo ranks on the CPU, each playing a host)
under ``healthsvc supervise`` against a real server, with a bit flipped in one replica's weights
after the update of ``--fault-step``. The fingerprints see it; the supervisor restarts from the
checkpoint they prove clean, without the blamed host.

The naive restart is measured in the same run: resume from the newest checkpoint once the fault is
noticed. A flipped bit raises no error, hangs nothing and does not move the loss, so neither a
timeout nor the loss would ever notice it; the naive restart is credited with the supervisor's
moment of noticing (when the job was stopped), which favours it. Its checkpoint was written after
the flip, and the host is still in, so every step after it trains on corrupted state.

Figures, per row:
- fault -> healthy step, s: from the flip (its step's time, interpolated between the checkpoints
  around it) to the first step of the next attempt trained on clean state;
- steps thrown away: steps of the stopped attempt after the checkpoint resumed from;
- clean steps thrown away: those of them at or before the fault (the work between the resumed
  checkpoint and the flip), of which none is at or before a checkpoint the rollback answer calls
  clean when the restart is from that checkpoint;
- corrupted steps: steps trained on corrupted state, in the stopped attempt and after the restart;
- of them after the restart: for the supervised restart, measured: the steps of the next attempt
  from the onset of a ``replica_mismatch`` found in it (0 when its fingerprints, every 5 steps,
  agreed throughout); for the naive one, every step after its checkpoint (the flip is in it).

The supervised restart must resume from the checkpoint of the rollback event it posted (the
rollback answer's); the bench exits non-zero otherwise, as when the supervised run fails.

    PYTHONPATH=. python bench/recovery.py            # 4 ranks, 200 steps (about 30 s)
    PYTHONPATH=. python bench/recovery.py --smoke    # 3 ranks, 400 steps
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server_process import ServerProcess  # noqa: E402

TRAIN = ROOT / "examples" / "train.py"


def supervised_run(url: str, run_id: str, tmp: Path, args: argparse.Namespace) -> float:
    """Train under ``healthsvc supervise``; returns its wall time, s."""
    hosts = ",".join(f"node{i}" for i in range(args.ranks))
    train = [sys.executable, str(TRAIN), "--url", url, "--run-id", run_id, "--log-every", "0",
             "--heartbeat-s", "0.5", "--ckpt-dir", str(tmp / "ckpt"), "--ckpt-every", "10",
             "--steps", str(args.steps), "--fingerprint-every", "5", "--fault", "weight_bitflip",
             "--fault-rank", str(args.ranks - 1), "--fault-step", str(args.fault_step),
             "--hosts", hosts, "--resume", "{checkpoint}", "--exclude", "{exclude_hosts}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "healthsvc", "supervise", "--run-id", run_id,
                          "--url", url, "--poll-s", "0.3", "--grace-s", "10", "--", *train],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the supervised run failed ({out.returncode}):\n{out.stderr[-3000:]}\n"
                         f"{what_the_service_holds(url, run_id)}")
    return time.monotonic() - t0


def what_the_service_holds(url: str, run_id: str) -> str:
    """The run's attempts, checkpoints (with the service time each was stored) and findings, for
    a failure's message: a decision made on a checkpoint not yet stored shows here."""
    with httpx.Client(base_url=url, timeout=30) as http:
        run = http.get(f"/v1/runs/{run_id}").json()
        ckpts = http.get(f"/v1/runs/{run_id}/checkpoints").json()
        found = http.get(f"/v1/runs/{run_id}/findings").json()
    return "\n".join([
        f"attempts: {run.get('attempts')}",
        "checkpoints: " + ", ".join(f"{c['step']} (attempt {c['attempt']}, at {c['created_at']:.3f})" for c in ckpts),
        "findings: " + ", ".join(f"{f['kind']} {f['severity']} {f['status']} step {f['step']} attempt {f['attempt']} "
                                 f"ranks {f['ranks']} at {f['created_at']:.3f}" for f in found)])


def step_time(checkpoints: list[dict], step: int) -> float:
    """When ``step`` was trained: interpolated between the checkpoints around it (their times are
    the service's, as every other time here)."""
    before = max((c for c in checkpoints if c["step"] <= step), key=lambda c: c["step"])
    after = min((c for c in checkpoints if c["step"] > step), key=lambda c: c["step"])
    share = (step - before["step"]) / (after["step"] - before["step"])
    return before["at_s"] + share * (after["at_s"] - before["at_s"])


def rows(timeline: list[dict], fault_step: int, steps: int, mismatches_after: list[dict]
         ) -> list[tuple[str, str, str, int, int, int, int]]:
    """``mismatches_after``: the firing ``replica_mismatch`` findings of the attempts after the
    restart (none: the next attempt's fingerprints agreed throughout)."""
    first = [e for e in timeline if e["attempt"] == 1]
    ckpts = [e for e in first if e["kind"] == "checkpoint"]
    [ended] = [e for e in first if e["kind"] == "attempt_ended"]
    [second] = [e for e in timeline if e["kind"] == "attempt_started" and e["attempt"] == 2]
    fault_at = step_time(ckpts, fault_step)
    last = ended["step"]                           # the stopped attempt's last step
    corrupted_before = last - fault_step           # steps after the flip, until the stop
    onset = min((f["onset_step"] or f["step"] for f in mismatches_after), default=None)
    out = []
    for name, resumed, supervised in (("healthsvc supervise (proven-clean checkpoint, host out)",
                                       second["resumed_from_step"], True),
                                      ("naive restart (newest checkpoint, same hosts)",
                                       max(c["step"] for c in ckpts), False)):
        if supervised:   # measured: what the next attempt's fingerprints found
            after = 0 if onset is None else steps - onset
        else:            # the checkpoint of step s holds the update of s: after the flip, all corrupted
            after = 0 if resumed < fault_step else steps - 1 - resumed
        clean = resumed < fault_step and after == 0
        healthy_s = f"{second['at_s'] - fault_at:.1f}" if clean else "never"
        out.append((name, str(resumed), healthy_s, last - resumed,
                    max(0, min(fault_step, last) - resumed), corrupted_before + after, after))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--fault-step", type=int, default=23)
    ap.add_argument("--smoke", action="store_true", help="3 ranks (the fewest whose majority names the flipped replica), 400 steps (the job must outlast the restart decision, also on a loaded machine): proves it runs (tests)")
    args = ap.parse_args()
    if args.smoke:
        args.ranks, args.steps, args.fault_step = 3, 400, 13   # the job must outlast the restart decision
    run_id = "recovery"
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(os.path.join(tmp, "svc.db")) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        http.put(f"/v1/runs/{run_id}", json={"world_size": args.ranks}).raise_for_status()
        wall_s = supervised_run(srv.url, run_id, Path(tmp), args)
        timeline = http.get(f"/v1/runs/{run_id}/timeline").json()["entries"]
        found = [f for f in http.get(f"/v1/runs/{run_id}/findings").json() if f["kind"] == "replica_mismatch"]
        [restart] = [e for e in http.get(f"/v1/runs/{run_id}/events").json() if e["kind"] == "rollback"]
    after = [f for f in found if f["attempt"] >= 2 and f["status"] == "firing"]
    table = rows(timeline, args.fault_step, args.steps, after)
    if table[0][1] != str(restart["data"]["resume_from_checkpoint_step"]):
        raise SystemExit(f"the supervised restart resumed from step {table[0][1]}, not from the rollback "
                         f"answer's checkpoint ({restart['data']['resume_from_checkpoint_step']})")
    print(f"recovery from a weight bit flip at step {args.fault_step} of {args.steps} "
          f"({args.ranks} gloo ranks, checkpoints every 10 steps, fingerprints every 5; "
          f"supervised run {wall_s:.0f} s, 2-core shared machine)\n")
    print("| restart | resumed from step | fault -> healthy step s | steps thrown away "
          "| clean steps thrown away | corrupted steps | of them after the restart |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, resumed, healthy_s, thrown, clean, corrupted, after_restart in table:
        print(f"| {name} | {resumed} | {healthy_s} | {thrown} | {clean} | {corrupted} | {after_restart} |")
    print("\n| where the supervised recovery's time goes | s |\n|---|---:|")
    print(f"| fault -> finding | {min(f['created_at'] for f in found) - fault_time(timeline, args.fault_step):.1f} |")
    print(f"| finding -> restart decided (job stopped) | {restart['ts'] - min(f['created_at'] for f in found):.1f} |")
    print(f"| restart -> first step of the next attempt | {attempt_start(timeline) - restart['ts']:.1f} |")
    return 0


def fault_time(timeline: list[dict], fault_step: int) -> float:
    return step_time([e for e in timeline if e["attempt"] == 1 and e["kind"] == "checkpoint"], fault_step)


def attempt_start(timeline: list[dict]) -> float:
    return next(e["at_s"] for e in timeline if e["kind"] == "attempt_started" and e["attempt"] == 2)


if __name__ == "__main__":
    raise SystemExit(main())
