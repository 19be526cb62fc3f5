"""``healthsvc silence add|list|expire``: mute notifications for planned work, as ``amtool silence``::

    $ healthsvc silence add run=exp-42 alertname=straggler --duration 2h --comment "node17 drained"
    sil_4b1f0c2a9d3e
    silences run="exp-42" alertname="straggler" until 2026-12-04 21:30 UTC

    $ healthsvc silence list
    ID                MATCHERS                             STATE   ENDS                  BY   COMMENT
    sil_4b1f0c2a9d3e  run="exp-42" alertname="straggler"   active  2026-12-04 21:30 UTC  ann  node17 drained

    $ healthsvc silence expire sil_4b1f0c2a9d3e
    expired sil_4b1f0c2a9d3e

Matchers are ``label=value``, ``label!=value``, ``label=~regex`` or ``label!~regex`` (regexes are
anchored); a bare word is the alert name (``straggler`` = ``alertname=straggler``). Labels:
``alertname``, ``run``, ``rank``, ``metric``, ``severity``. ``add`` needs ``--duration`` (``90s``,
``30m``, ``2h``, ``1d``, ``1h30m``) or ``--until`` (ISO 8601; UTC unless it names a zone), and a
``--comment`` (why: the next on-call reads it). Its first line is the silence id alone, for a
script. ``list`` shows active and pending silences (``--all``: expired ones too). Exit status as
the other client commands (``healthsvc.cli_http``): 0 done, 1 refused, 2 unreachable or a
malformed argument.
"""
from __future__ import annotations

import argparse
import json
import re
import time
import urllib.parse
from datetime import datetime, timezone

from healthsvc.alerts_cli import add_by_arg, default_actor
from healthsvc.cli import command
from healthsvc.cli_http import OK, add_url_arg, call, table

_MATCHER = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(=~|!~|!=|=)(.*)$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_matcher(text: str) -> dict[str, str]:
    """``run=exp-42`` -> ``{"name": "run", "value": "exp-42", "op": "="}``; a bare word names the alert.

    >>> parse_matcher('rank=~"1[0-5]"'), parse_matcher("hang")["name"]
    ({'name': 'rank', 'value': '1[0-5]', 'op': '=~'}, 'alertname')
    """
    m = _MATCHER.match(text)
    if m is None:
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text):
            return {"name": "alertname", "value": text, "op": "="}
        raise argparse.ArgumentTypeError(f"{text!r} is not a matcher: write label=value, label!=value, "
                                         "label=~regex or label!~regex (e.g. run=exp-42)")
    name, op, value = m.groups()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return {"name": name, "value": value, "op": op}


def parse_duration(text: str) -> float:
    """``"1h30m"`` -> 5400.0 seconds.

    >>> parse_duration("90s"), parse_duration("1h30m"), parse_duration("2d")
    (90.0, 5400.0, 172800.0)
    """
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text or not sum(float(n) for n, _ in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write e.g. 90s, 30m, 2h, 1d or 1h30m")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def parse_until(text: str) -> float:
    """An ISO 8601 time (UTC unless it names a zone) -> unix seconds."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: write ISO 8601, e.g. 2026-12-05T08:00 "
                                         "(UTC) or 2026-12-05T09:00+01:00") from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


def show_matchers(matchers: list[dict]) -> str:
    return " ".join(f'{m["name"]}{m.get("op", "=")}"{m["value"]}"' for m in matchers)


def _silence_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="{add,list,expire}")
    a = sub.add_parser("add", help="mute matching alerts until an expiry",
                       description="Mute notifications of the alerts every matcher matches, until an expiry.")
    a.add_argument("matchers", nargs="+", type=parse_matcher, metavar="MATCHER",
                   help="label=value, label!=value, label=~regex, label!~regex, or an alert name")
    until = a.add_mutually_exclusive_group(required=True)
    until.add_argument("--duration", type=parse_duration, help="how long, e.g. 2h, 30m, 1h30m")
    until.add_argument("--until", type=parse_until, help="until when, ISO 8601 (UTC unless a zone is given)")
    a.add_argument("--comment", required=True, help="why (the next on-call reads it)")
    add_by_arg(a)
    a.add_argument("--json", action="store_true", help="print the silence as JSON")
    add_url_arg(a)
    q = sub.add_parser("list", help="active and pending silences (--all: expired too)")
    q.add_argument("--all", action="store_true", help="expired silences too")
    q.add_argument("--json", action="store_true", help="print the service's answer as JSON")
    add_url_arg(q)
    e = sub.add_parser("expire", help="end silences now")
    e.add_argument("ids", nargs="+", metavar="ID", help="silence ids (sil_...), as healthsvc silence list shows")
    add_url_arg(e)


def silence(args: argparse.Namespace) -> int:
    return {"add": _add, "list": _list, "expire": _expire}[args.action](args)


def _add(args: argparse.Namespace) -> int:
    body: dict = {"matchers": args.matchers, "comment": args.comment,
                  "created_by": args.by if args.by is not None else default_actor()}
    if args.duration is not None:
        body["duration_s"] = args.duration
    else:
        body["ends_at"] = args.until
    answer, rc = call("POST", args.url, "/v1/silences", body)
    if rc != OK:
        return rc
    if args.json:
        print(json.dumps(answer, indent=2))
        return OK
    print(answer["id"])
    print(f"silences {show_matchers(answer['matchers'])} until {utc(answer['ends_at'])}")
    return OK


def _list(args: argparse.Namespace) -> int:
    answer, rc = call("GET", args.url, "/v1/silences")
    if rc != OK:
        return rc
    shown = [s for s in answer["silences"] if args.all or s["state"] != "expired"]
    if args.json:
        print(json.dumps({"silences": shown}, indent=2))
        return OK
    if not shown:
        print(f"no {'' if args.all else 'active or pending '}silences on {args.url}")
        return OK
    rows = [["ID", "MATCHERS", "STATE", "ENDS", "BY", "COMMENT"]]
    for s in sorted(shown, key=lambda s: s["ends_at"]):
        rows.append([s["id"], show_matchers(s["matchers"]), s["state"], utc(s["ends_at"]),
                     s.get("created_by") or "-", s.get("comment") or "-"])
    print(table(rows))
    return OK


def _expire(args: argparse.Namespace) -> int:
    worst = OK
    for sid in args.ids:
        answer, rc = call("DELETE", args.url, f"/v1/silences/{urllib.parse.quote(sid, safe='')}")
        if rc != OK:
            worst = max(worst, rc)
            continue
        print(f"expired {answer['id']}")
    return worst


silence.add_arguments = _silence_args  # type: ignore[attr-defined]
command("silence", "silences: add (matchers, expiry, comment), list, expire")(silence)
