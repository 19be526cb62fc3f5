"""``healthsvc sync SPOOL... [--url URL]``: upload offline spools written by the client
(``HEALTHSVC_MODE=offline`` or ``init(..., spool=PATH)``) to a running service.

Re-running it after a partial failure is safe: metrics batches carry the ``batch_id`` they were
spooled with, and the service stores a batch once within its dedupe window
(``HEALTHSVC_DEDUPE_WINDOW_S``, an hour by default; raise it on a service that takes late syncs). Exit status 0 when every line was sent, 1 when
some were rejected or failed (the message says which), 2 when nothing could be read.
"""
from __future__ import annotations

import argparse
import os
import sys

from healthsvc.cli import command

DEFAULT_URL = "http://127.0.0.1:8080"


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spools", nargs="+", help="spool files (JSON lines) or folders of them")
    p.add_argument("--url", default=os.environ.get("HEALTHSVC_URL", DEFAULT_URL),
                   help="service base URL (env HEALTHSVC_URL; default %(default)s)")


def _files(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".jsonl"))
        else:
            out.append(p)
    return out


def sync(args: argparse.Namespace) -> int:
    from healthsvc_client.sync import upload_spool

    files = _files(args.spools)
    missing = [f for f in files if not os.path.isfile(f)]
    if not files or missing:
        print(f"healthsvc sync: no such spool file: {', '.join(missing) or ' '.join(args.spools)}", file=sys.stderr)
        return 2
    totals = {"lines": 0, "sent": 0, "failed": 0, "rejected": 0, "bad": 0}
    for i, path in enumerate(files, 1):
        res = upload_spool(path, args.url)
        totals["lines"] += res["lines"]
        totals["sent"] += res["sent"]
        totals["failed"] += res["failed"]
        totals["rejected"] += res["rejected"]
        totals["bad"] += len(res["bad_lines"])
        status = "ok" if res["sent"] == res["lines"] and not res["bad_lines"] else "INCOMPLETE"
        print(f"[{i}/{len(files)}] {path}: {res['sent']}/{res['lines']} requests sent "
              f"({res['failed']} failed, {res['rejected']} rejected, {len(res['bad_lines'])} unreadable lines) {status}",
              flush=True)
        for err in res["errors"][:3]:
            print(f"    {err}", file=sys.stderr)
    print(f"synced {totals['sent']} of {totals['lines']} requests to {args.url}")
    if totals["failed"] or totals["rejected"] or totals["bad"]:
        print("some requests were not accepted; fix the cause and run sync again within the hour (it does not duplicate data)",
              file=sys.stderr)
        return 1
    return 0


sync.add_arguments = _args  # type: ignore[attr-defined]
command("sync", "upload offline spool files to a service")(sync)
