"""The ``healthsvc`` command line: ``serve`` (the default), and tools around a running service."""
from __future__ import annotations

import argparse
import gc
import logging
import sys
from typing import Callable

# name -> (help, add_arguments(parser), run(args) -> exit status)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}

SERVER_EXTRA_HINT = ("healthsvc serve needs the server dependencies, which a client-only install "
                     "leaves out: pip install 'healthsvc[server]'")


def command(name: str, help_text: str):
    """Register ``add_arguments(parser)`` + ``run(args) -> int`` under a subcommand name."""
    def wrap(fn):
        COMMANDS[name] = (help_text, fn.add_arguments, fn)
        return fn
    return wrap


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="store URI (default: sqlite:///healthsvc.db; env HEALTHSVC_DB)")
    p.add_argument("--host", help="listen address (default 127.0.0.1; env HEALTHSVC_HOST)")
    p.add_argument("--port", type=int, help="listen port (default 8080; env HEALTHSVC_PORT)")
    p.add_argument("--log-level", help="debug, info, warning, error")
    p.add_argument("--access-log", action="store_true", default=None, help="log every request")
    p.add_argument("--insecure", action="store_true", default=None,
                   help="allow a non-loopback --host with no token configured (anyone can administer it)")


def serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from healthsvc.app import create_asgi
        from healthsvc.ingest.protocol import protocol_for
        from healthsvc.settings import Settings
    except ImportError as exc:  # the client-only install (`pip install .`) has no server stack
        print(f"{SERVER_EXTRA_HINT} (missing: {exc.name})", file=sys.stderr)
        return 2

    overrides = {k: v for k, v in {"db": args.db, "host": args.host, "port": args.port,
                                   "log_level": args.log_level, "access_log": args.access_log,
                                   "insecure": args.insecure}.items()
                 if v is not None}
    settings = Settings(**overrides)
    # A database a newer healthsvc migrated, or one that cannot be reached: say so and stop
    # (not a traceback from inside the server's startup).
    from healthsvc.store.errors import STORE_ERRORS
    from healthsvc.store.migrations import SchemaTooNew
    from healthsvc.store.open import open_store, redact
    where = redact(settings.db)   # every line below shows the store without its password
    try:
        store = open_store(settings.db)
        store.check_schema()
    except SchemaTooNew as exc:
        print(f"healthsvc: {exc}", file=sys.stderr)
        return 2
    except STORE_ERRORS + (ValueError, RuntimeError) as exc:
        print(f"healthsvc: cannot open the store {where}: {redact(str(exc))}".rstrip(), file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Before the service's threads start (each would take an arena of its own): the allocator's
    # arenas capped, freed memory trimmed by the app (healthsvc.ops.allocator says why).
    from healthsvc.ops import allocator
    allocator.tune(settings.malloc_arena_max)
    print(f"healthsvc: serving on http://{settings.host}:{settings.port} (store {where}); "
          f"API docs at /docs", file=sys.stderr, flush=True)
    app = create_asgi(settings)
    tune_gc_for_serving()
    # The client's address behind a proxy (uvicorn's X-Forwarded-For middleware, a step of every
    # request) is read by nothing but the access log: with the log off it is not worked out
    # (1-2 % of a 64-record push's server CPU, bench/ab_concurrent.py).
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                access_log=settings.access_log, proxy_headers=settings.access_log, timeout_graceful_shutdown=5,
                http=protocol_for(app, settings.access_log))
    return 0


# Tracked objects allocated (net of those freed) before the garbage collector's youngest
# generation is collected: Python's default is 700. A 1,024-record push in rows is a dict per
# record, alive until its columns are built: at 700 every such push triggered three young
# collections, each walking the push's records, and a full one every fifty pushes walking every
# live object: a tenth of the push's CPU (timed by hand with gc.callbacks over
# bench/ingest_inproc.py: 240 us of 2.4 ms, on this tree and on 91dd201 alike). Above the records of the largest usual push, a push's own objects
# are freed before any collection. Cyclic garbage waits longer: at most this many objects more
# (a few MB).
GC_YOUNG_THRESHOLD = 50_000


def tune_gc_for_serving() -> None:
    """The garbage collector as the server's process wants it (``healthsvc serve``, and the
    benches that drive the served app in process):

    - what start-up built (modules, routes, schemas: most of the process's tracked objects, alive
      as long as it is) is left out of the full collections, which walk every tracked object on
      every push that triggers one; what start-up left as garbage is collected first;
    - the youngest generation is collected after :data:`GC_YOUNG_THRESHOLD` objects, not 700.

    (The server's process only: a process that builds apps again and again, as the tests do,
    would keep their garbage for good.)"""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


serve.add_arguments = _serve_args  # type: ignore[attr-defined]
command("serve", "run the service")(serve)


def _load_commands() -> None:
    """Each feature's CLI registers its subcommands with ``@command`` on import (a feature's CLI
    lives with it). Imported here, not at the top: they import this module for ``command``."""
    from healthsvc import alerts_cli, run_cli, silence_cli, sync_cli  # noqa: F401
    from healthsvc.rollback import cli as rollback_cli  # noqa: F401
    from healthsvc.supervise import cli as supervise_cli  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    _load_commands()
    from healthsvc import __version__

    parser = argparse.ArgumentParser(prog="healthsvc", description="Training-run health service.")
    parser.add_argument("--version", action="version", version=f"healthsvc {__version__}")
    sub = parser.add_subparsers(dest="command")
    for name, (help_text, add_arguments, _) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["serve", *argv]
    args = parser.parse_args(argv)
    return COMMANDS[args.command][2](args)


if __name__ == "__main__":
    raise SystemExit(main())
