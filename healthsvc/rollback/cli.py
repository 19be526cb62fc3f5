"""``healthsvc rollback RUN`` and ``healthsvc bisect ...``: the rollback answer from the shell.

    healthsvc rollback RUN [--json]            target checkpoint, onset interval, reason
    healthsvc bisect start RUN [--steps 100 200 ...] [--known-good S] [--known-bad S]
    healthsvc bisect status RUN                next probe, last good, first bad
    healthsvc bisect report RUN STEP good|bad [--value X]
    healthsvc bisect abandon RUN

Talks to the service over HTTP with the standard library (``healthsvc.cli_http``: ``--url``,
default env HEALTHSVC_URL or http://127.0.0.1:8080; ``HEALTHSVC_TOKEN`` is sent as a bearer token).
Exit status: 0 on success, 1 when the service refuses (the message says why), 2 when it cannot be
reached, 3 from ``rollback`` when there is no checkpoint to resume from (its first line is then
``none``: a restart script under ``set -e`` stops rather than resume from nothing).
``rollback`` prints the checkpoint URI alone on its first line, so a restart script can ``read`` it.
"""
from __future__ import annotations

import argparse
import json

from healthsvc.cli import command
from healthsvc.cli_http import NOTHING, add_url_arg, call, fields


def _rollback_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id")
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    add_url_arg(p)


def rollback(args: argparse.Namespace) -> int:
    answer, rc = call("GET", args.url, f"/v1/runs/{args.run}/rollback")
    if answer is None:
        return rc
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0 if answer["checkpoint"] else NOTHING
    ckpt, onset = answer["checkpoint"], answer["onset"]
    print(ckpt["uri"] if ckpt else "none")
    where = "none" if ckpt is None else f"step {ckpt['step']} ({ckpt['uri']})"
    print(f"checkpoint: {where}")
    if onset is None:
        print("onset:      none (no corruption evident)")
    else:
        print(f"onset:      step {onset['step']} (interval {onset['low']}..{onset['high']}, "
              f"confidence {onset['confidence']:.2f}, from {', '.join(onset['signals_used'])})")
    if answer.get("skip_data_range"):
        a, b = answer["skip_data_range"]
        print(f"skip data:  steps {a}..{b}")
    if answer.get("conservative"):
        print("conservative: yes (a bisection can recover the checkpoints passed over)")
    print(f"reason:     {answer['reason']}")
    return 0 if ckpt else NOTHING


rollback.add_arguments = _rollback_args  # type: ignore[attr-defined]
command("rollback", "where to resume a run from: checkpoint, onset interval, reason")(rollback)


def _bisect_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("start", help="start a bisection over the run's checkpoints")
    s.add_argument("run")
    s.add_argument("--steps", type=int, nargs="+", help="checkpoint steps (default: the onset interval)")
    s.add_argument("--known-good", type=int)
    s.add_argument("--known-bad", type=int)
    add_url_arg(s)
    for name, text in (("status", "next probe, last good, first bad"),
                       ("abandon", "forget the bisection (checkpoint verdicts stay)")):
        q = sub.add_parser(name, help=text)
        q.add_argument("run")
        add_url_arg(q)
    r = sub.add_parser("report", help="report a probe's verdict")
    r.add_argument("run")
    r.add_argument("step", type=int)
    r.add_argument("verdict", choices=("good", "bad"))
    r.add_argument("--value", type=float, help="the probe's own number (say, a loss)")
    add_url_arg(r)


def _step(value, unknown: str) -> str:
    """A checkpoint step, or what its absence means (never "None")."""
    return unknown if value is None else f"step {value}"


def render_bisection(st: dict) -> str:
    """The bisection state as aligned ``key: value`` lines."""
    good = _step(st["last_good"], "none (every probed checkpoint was bad)" if st["done"] else "none yet")
    bad = _step(st["first_bad"], "none (every probed checkpoint was good)" if st["done"] else "none yet")
    if st["done"]:
        return fields([("bisection", f"done after {st['probes']} probe(s)"),
                       ("last good", good), ("first bad", bad)])
    nxt = st["next_probe"]
    return fields([("bisection", f"probe checkpoint {nxt['step']} next, at most {st['remaining_probes']} probe(s) left"),
                   ("probe", f"step {nxt['step']} ({nxt['uri']})"),
                   ("last good", good), ("first bad", bad)])


def _print_status(st: dict) -> None:
    print(render_bisection(st))


def bisect(args: argparse.Namespace) -> int:
    base = f"/v1/runs/{args.run}/bisection"
    if args.action == "start":
        body = {"steps": args.steps, "known_good": args.known_good, "known_bad": args.known_bad}
        st, rc = call("POST", args.url, base, body)
    elif args.action == "status":
        st, rc = call("GET", args.url, base)
    elif args.action == "report":
        st, rc = call("POST", args.url, base + "/reports",
                       {"step": args.step, "good": args.verdict == "good", "value": args.value})
    else:
        st, rc = call("DELETE", args.url, base)
        if st is not None:
            print("bisection abandoned")
        return rc
    if st is None:
        return rc
    _print_status(st)
    return 0


bisect.add_arguments = _bisect_args  # type: ignore[attr-defined]
command("bisect", "drive an active bisection over checkpoints: start, status, report, abandon")(bisect)
