"""``healthsvc alerts``, ``healthsvc ack`` and ``healthsvc findings``: what pages, and why, from
the shell of an on-call engineer (``amtool alert query`` and ``amtool alert ack``'s jobs)::

    $ healthsvc alerts --run exp-42
    FINGERPRINT       ALERT       RUN     RANK  SEVERITY  STATE  SINCE   SUMMARY
    3f2a9c0d1e2b4f5a  non_finite  exp-42  3     critical  acked  5m ago  non finite in loss on rank 3 ...

    $ healthsvc ack 3f2a9c0d1e2b4f5a --by ann
    acknowledged 3f2a9c0d1e2b4f5a (non_finite, run exp-42) by ann

    $ healthsvc findings exp-42 --kind non_finite
    ID  STEP  KIND        SEVERITY  STATUS  RANKS  HOSTS  METRIC
    17  1187  non_finite  critical  firing  3      node0  loss

``alerts`` lists firing alerts by default (``--status resolved|all`` for the others); STATE is
``firing``, ``acked`` (someone is on it: no reminders), ``silenced`` or ``inhibited`` (its
notifications are muted), or ``resolved``. ``--json`` prints the service's answer as it is.
Standard library only (``healthsvc.cli_http``); exit status 0 answered, 1 refused (an unknown
fingerprint or run: the message says which), 2 unreachable.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import urllib.parse

from healthsvc.cli import command
from healthsvc.cli_http import OK, add_url_arg, call, get_to_show, table
from healthsvc.run_cli import ago

SEVERITIES = ("info", "warning", "critical")
SUMMARY_CHARS = 80


def default_actor() -> str:
    """Who is acting, for ``--by``: ``$HEALTHSVC_USER``, else the login name."""
    try:
        return os.environ.get("HEALTHSVC_USER") or getpass.getuser()
    except (KeyError, OSError):   # no login name (a container without a passwd entry)
        return ""


def add_by_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--by", default=None, help="who you are, shown in notifications (default: $HEALTHSVC_USER, "
                                              "else your login name)")


def query(params: dict[str, object]) -> str:
    """``?a=1&b=x`` of the params that are set (None left out)."""
    shown = {k: v for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(shown) if shown else ""


def alert_state(a: dict) -> str:
    """One word for what is done about an alert (see the module docstring)."""
    if a["status"] == "resolved":
        return "resolved"
    if a.get("silenced_by"):
        return "silenced"
    if a.get("inhibited"):
        return "inhibited"
    return "acked" if a.get("acknowledged_at") is not None else "firing"


def _clip(text: str, n: int = SUMMARY_CHARS) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


# -- alerts -------------------------------------------------------------------------------------

def _alerts_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", help="only this run")
    p.add_argument("--kind", help="only this alert name (finding kind), e.g. non_finite")
    p.add_argument("--status", choices=("firing", "resolved", "all"), default="firing",
                   help="firing (default), resolved, or all")
    p.add_argument("--min-severity", choices=SEVERITIES, help="only alerts at least this severe")
    p.add_argument("--json", action="store_true", help="print the service's answer as JSON")
    add_url_arg(p)


def alerts(args: argparse.Namespace) -> int:
    params = {"run": args.run, "kind": args.kind, "min_severity": args.min_severity,
              "status": None if args.status == "all" else args.status}
    answer, done = get_to_show(args, "/v1/alerts" + query(params))
    if done is not None:
        return done
    found = answer["alerts"]
    if not found:
        which = "" if args.status == "all" else f"{args.status} "
        print(f"no {which}alerts on {args.url}" + (f" for run {args.run}" if args.run else ""))
        return OK
    rows = [["FINGERPRINT", "ALERT", "RUN", "RANK", "SEVERITY", "STATE", "SINCE", "SUMMARY"]]
    for a in found:
        rows.append([a["fingerprint"], a["kind"], a["run"], a["labels"].get("rank", "*"), a["severity"],
                     alert_state(a), ago(a["starts_at"]), _clip(a["annotations"].get("summary", ""))])
    print(table(rows))
    return OK


alerts.add_arguments = _alerts_args  # type: ignore[attr-defined]
command("alerts", "list alerts (firing by default): name, run, rank, severity, acked/silenced, summary")(alerts)


# -- ack ----------------------------------------------------------------------------------------

def _ack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("fingerprints", nargs="+", metavar="FINGERPRINT", help="alert fingerprints (healthsvc alerts)")
    add_by_arg(p)
    p.add_argument("--json", action="store_true", help="print the acknowledged alerts as JSON")
    add_url_arg(p)


def ack(args: argparse.Namespace) -> int:
    by = args.by if args.by is not None else default_actor()
    worst, done = OK, []
    for fp in args.fingerprints:
        answer, rc = call("POST", args.url, f"/v1/alerts/{urllib.parse.quote(fp, safe='')}/acknowledge", {"by": by})
        if rc != OK:
            worst = max(worst, rc)
            continue
        done.append(answer)
        if not args.json:
            print(f"acknowledged {answer['fingerprint']} ({answer['kind']}, run {answer['run']})"
                  + (f" by {by}" if by else ""))
    if args.json:
        print(json.dumps(done, indent=2))
    return worst


ack.add_arguments = _ack_args  # type: ignore[attr-defined]
command("ack", "acknowledge alerts: someone is on it, repeat notifications stop")(ack)


# -- findings -----------------------------------------------------------------------------------

def _findings_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id")
    p.add_argument("--kind", help="only this kind, e.g. hang")
    p.add_argument("--status", choices=("firing", "resolved"), help="only firing or only resolved findings")
    p.add_argument("--since-step", type=int, help="only findings at or after this step")
    p.add_argument("--min-severity", choices=SEVERITIES, help="only findings at least this severe")
    p.add_argument("--limit", type=int, default=1000, help="at most this many, oldest first (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the service's answer as JSON (with the evidence)")
    add_url_arg(p)


def _shown(values: list, n: int = 8) -> str:
    """The first ``n`` values, comma-separated, and how many more."""
    text = ",".join("?" if v is None else str(v) for v in values[:n])
    return text + (f" +{len(values) - n}" if len(values) > n else "")


def findings(args: argparse.Namespace) -> int:
    params = {"kind": args.kind, "status": args.status, "since_step": args.since_step,
              "min_severity": args.min_severity, "limit": args.limit}
    path = f"/v1/runs/{urllib.parse.quote(args.run, safe='')}/findings" + query(params)
    answer, done = get_to_show(args, path)
    if done is not None:
        return done
    if not answer:
        print(f"no findings for run {args.run}")
        return OK
    rows = [["ID", "STEP", "KIND", "SEVERITY", "STATUS", "RANKS", "HOSTS", "METRIC"]]
    for f in answer:
        rows.append([str(f["id"]), str(f["step"]), f["kind"], f["severity"], f["status"],
                     _shown(f["ranks"]) or "all", _shown(f["hosts"]) or "-", f.get("metric") or "-"])
    print(table(rows))
    return OK


findings.add_arguments = _findings_args  # type: ignore[attr-defined]
command("findings", "what the detectors found in a run: step, kind, severity, ranks, hosts")(findings)
