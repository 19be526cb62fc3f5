"""``healthsvc rollback RUN`` and ``healthsvc bisect ...``: the rollback answer from the shell.

    healthsvc rollback RUN [--json]            target checkpoint, onset interval, reason
    healthsvc bisect start RUN [--steps 100 200 ...] [--known-good S] [--known-bad S]
    healthsvc bisect status RUN                next probe, last good, first bad
    healthsvc bisect report RUN STEP good|bad [--value X]
    healthsvc bisect abandon RUN

Talks to the service over HTTP (``--url``, default env HEALTHSVC_URL or http://127.0.0.1:8080).
Exit status: 0 on success, 1 when the service refuses (the message says why), 2 when it cannot be
reached. ``rollback`` prints the checkpoint URI alone on its first line, so a restart script can
``read`` it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from healthsvc.cli import command

DEFAULT_URL = "http://127.0.0.1:8080"


def _url_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("HEALTHSVC_URL", DEFAULT_URL),
                   help="service base URL (env HEALTHSVC_URL; default %(default)s)")


def _call(method: str, url: str, path: str, body: dict | None = None):
    import httpx
    try:
        from clients.auth import auth_headers  # HEALTHSVC_TOKEN, as the client sends it

        with httpx.Client(base_url=url, timeout=60, headers=auth_headers()) as client:
            r = client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        print(f"healthsvc: cannot reach {url}: {exc}", file=sys.stderr)
        return None, 2
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail")
            msg = "; ".join(d.get("msg", "") + (f" ({d['hint']})" if d.get("hint") else "")
                            for d in detail) if isinstance(detail, list) else str(detail)
        except ValueError:
            msg = r.text
        print(f"healthsvc: {r.status_code}: {msg}", file=sys.stderr)
        return None, 1
    return r.json(), 0


def _rollback_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id")
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    _url_arg(p)


def rollback(args: argparse.Namespace) -> int:
    answer, rc = _call("GET", args.url, f"/v1/runs/{args.run}/rollback")
    if answer is None:
        return rc
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
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
    return 0


rollback.add_arguments = _rollback_args  # type: ignore[attr-defined]
command("rollback", "where to resume a run from: checkpoint, onset interval, reason")(rollback)


def _bisect_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("start", help="start a bisection over the run's checkpoints")
    s.add_argument("run")
    s.add_argument("--steps", type=int, nargs="+", help="checkpoint steps (default: the onset interval)")
    s.add_argument("--known-good", type=int)
    s.add_argument("--known-bad", type=int)
    _url_arg(s)
    for name, text in (("status", "next probe, last good, first bad"),
                       ("abandon", "forget the bisection (checkpoint verdicts stay)")):
        q = sub.add_parser(name, help=text)
        q.add_argument("run")
        _url_arg(q)
    r = sub.add_parser("report", help="report a probe's verdict")
    r.add_argument("run")
    r.add_argument("step", type=int)
    r.add_argument("verdict", choices=("good", "bad"))
    r.add_argument("--value", type=float, help="the probe's own number (say, a loss)")
    _url_arg(r)


def _print_status(st: dict) -> None:
    nxt = st["next_probe"]
    if st["done"]:
        print(f"done after {st['probes']} probe(s): last good checkpoint {st['last_good']}, "
              f"first bad {st['first_bad']}")
    else:
        print(f"probe checkpoint {nxt['step']} ({nxt['uri']}) next; "
              f"at most {st['remaining_probes']} probe(s) left; "
              f"last good so far {st['last_good']}, first bad {st['first_bad']}")


def bisect(args: argparse.Namespace) -> int:
    base = f"/v1/runs/{args.run}/bisection"
    if args.action == "start":
        body = {"steps": args.steps, "known_good": args.known_good, "known_bad": args.known_bad}
        st, rc = _call("POST", args.url, base, body)
    elif args.action == "status":
        st, rc = _call("GET", args.url, base)
    elif args.action == "report":
        st, rc = _call("POST", args.url, base + "/reports",
                       {"step": args.step, "good": args.verdict == "good", "value": args.value})
    else:
        st, rc = _call("DELETE", args.url, base)
        if st is not None:
            print("bisection abandoned")
        return rc
    if st is None:
        return rc
    _print_status(st)
    return 0


bisect.add_arguments = _bisect_args  # type: ignore[attr-defined]
command("bisect", "drive an active bisection over checkpoints: start, status, report, abandon")(bisect)
