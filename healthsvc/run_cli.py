"""``healthsvc runs`` and ``healthsvc status RUN``: what is running and how it is doing.

    $ healthsvc runs
    RUN     STATUS    STEP  RANKS  LAST PUSH
    exp-42  running   1200  64     3s ago
    exp-41  finished  9000  64     2h ago

    $ healthsvc status exp-42
    run:       exp-42
    status:    running, attempt 2
    health:    critical
    step:      1200
    ranks:     64 of 64
    last push: 3s ago
    rollback:  step 1000 (s3://ckpt/exp-42/1000)

    FINDING     SEVERITY  STEP  RANKS
    non_finite  critical  1187  3

Exit status (``healthsvc.cli_http``): 0 answered, 1 refused (unknown run), 2 unreachable; with
``status --exit-status``, 4 when the run's health is critical (for a script that must stop).
"""
from __future__ import annotations

import argparse
import json
import time
import urllib.parse

from healthsvc.cli import command
from healthsvc.cli_http import OK, add_url_arg, call, fields, get_to_show, table

CRITICAL = 4


def ago(ts: float | None, now: float | None = None) -> str:
    """``"3s ago"``, ``"5m ago"``, ``"2h ago"``, ``"3d ago"``; ``"never"`` for None.

    >>> ago(100.0, now=103.4), ago(0.0, now=7200.0), ago(None)
    ('3s ago', '2h ago', 'never')
    """
    if ts is None:
        return "never"
    s = max(0.0, (time.time() if now is None else now) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit} ago"
    return f"{int(s)}s ago"


def _dash(v) -> str:
    return "-" if v is None else str(v)


def _runs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the service's answer as JSON")
    add_url_arg(p)


def runs(args: argparse.Namespace) -> int:
    answer, done = get_to_show(args, "/v1/runs")
    if done is not None:
        return done
    if not answer:
        print(f"no runs on {args.url}")
        return OK
    rows = [["RUN", "STATUS", "STEP", "RANKS", "LAST PUSH"]]
    for r in sorted(answer, key=lambda r: r.get("last_push") or r["created_at"], reverse=True):
        rows.append([r["run_id"], r["status"], _dash(r.get("last_step")), str(r.get("ranks_seen", 0)),
                     ago(r.get("last_push"))])
    print(table(rows))
    return OK


runs.add_arguments = _runs_args  # type: ignore[attr-defined]
command("runs", "list runs: status, last step, ranks, last push")(runs)


def _status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id")
    p.add_argument("--json", action="store_true", help="print the service's answer as JSON")
    p.add_argument("--exit-status", action="store_true",
                   help=f"exit {CRITICAL} when the run's health is critical")
    add_url_arg(p)


def status(args: argparse.Namespace) -> int:
    answer, rc = call("GET", args.url, f"/v1/runs/{urllib.parse.quote(args.run, safe='')}")
    if rc != OK:
        return rc
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(render_status(answer))
    if args.exit_status and answer.get("health") == "critical":
        return CRITICAL
    return OK


def render_status(r: dict) -> str:
    ckpt = r.get("rollback")
    world = r.get("world_size")
    out = fields([
        ("run", r["run_id"]),
        ("status", f"{r['status']}, attempt {r.get('attempt', 0)}"),
        ("health", r.get("health") or "unknown"),
        ("step", _dash(r.get("last_step"))),
        ("ranks", f"{r.get('ranks_seen', 0)}" + (f" of {world}" if world else "")),
        ("last push", ago(r.get("last_push"))),
        ("rollback", "none" if not ckpt else f"step {ckpt['step']} ({ckpt['uri']})"),
    ])
    active = r.get("active_findings") or []
    if active:
        rows = [["FINDING", "SEVERITY", "STEP", "RANKS"]]
        for f in active:
            ranks = f.get("ranks") or []
            shown = ",".join(map(str, ranks[:8])) + (f" +{len(ranks) - 8}" if len(ranks) > 8 else "")
            rows.append([f["kind"], f["severity"], str(f["step"]), shown or "all"])
        out += "\n\n" + table(rows)
    return out


status.add_arguments = _status_args  # type: ignore[attr-defined]
command("status", "one run: status, health, step, ranks, active findings, rollback target")(status)
