"""The per-host relay: the ranks of one host hand their metrics to one local process, which sends
them to the service as ONE columnar push per interval (per run), so a 16,384-rank job on 8-GPU
hosts makes 2,048 metrics requests per interval instead of 16,384. Standard library only.

Start one per host before the ranks (a launcher's job, or the local-rank-0 process's), and point
the ranks at its socket::

    python -m healthsvc_client.relay --url http://healthsvc:8000 --socket /tmp/healthsvc-relay.sock &
    HEALTHSVC_RELAY=/tmp/healthsvc-relay.sock torchrun ... train.py    # init() reads it

or ``health.init(..., relay="/tmp/healthsvc-relay.sock")``. The relay prints ``listening <path>``
on stdout once the socket accepts connections. SIGTERM (or SIGINT) sends what is pending, prints
``stopped: merged N rank batches into M pushes (...)``, then exits.

What goes through it: only the rows a rank's sender thread posts to ``/metrics``, except a batch
holding a NaN or infinity, which the rank posts itself at once (through the relay it would wait
for the body before it and a gather window: a page must not). Heartbeats go
direct (they are how the service tells a silent rank from a dead one: they must not depend on a
second process), and so do checkpoints, events, finish and ``log_columns`` blocks (rare, or
already batched). The training thread never sees the relay: ``log()`` only appends to the rank's
queue, as without one (``bench/relay.py``).

Protocol (one Unix stream connection per rank's sender; newline-delimited JSON, NaN as the
``NaN`` token)::

    rank  -> relay  {"id": <the rank's batch_id>, "path": "/v1/runs/<run>/metrics",
                     "records": [...], "urgent": bool}
    relay -> rank   {"id": ..., "prepared": "<file>"}   the records are in the body in <file>
    relay -> rank   {"id": ..., "status": "done"}       that body was accepted (or spooled here)
                    {"id": ..., "status": "rejected"}   the service refused it (4xx): not stored
                    {"id": ..., "status": "failed"}     given up on: may or may not be stored

Delivery is at least once and idempotent, as the direct sender's: every interval the relay
concatenates the batches pending for a run into one ``{"batch_id": K, "columns": ...}`` body
(records keep their own ``rank``, ``host``, ``world_size`` and ``ts``; a field a record lacks is
``null``, not reported, and NaN stays the ``NaN`` token), writes it to ``<pending-dir>/K.json``,
tells each member rank, and only then posts it (retried byte for byte: the service deduplicates
by ``batch_id``). A rank keeps its records until it hears ``done``. If the relay dies, the
connection closes and the rank falls back: records never prepared are posted directly under the
rank's own ``batch_id`` (the relay never posted them); records in a prepared body are posted by
re-sending that body file under the relay's key ``K`` (several ranks may: the service stores it
once). A file exists until its body was accepted, so a missing file means the body is stored.
``rejected`` makes the rank post its own records directly (one bad record must not lose its
host's others; the refused body's file is renamed ``K.rejected`` first, so a rank that missed the
answer does not read its absence as "stored"; files older than an hour are swept); ``failed`` makes it re-send the body file with its own retries and spool. A relay
that stalls (stopped, not dead) for longer than the ranks' ``relay_timeout_s`` and then resumes
can store one interval's records of those ranks twice: the one case outside exactly once.

Several runs share one relay (bodies are per run path; one flusher thread posts them in turn, so a
slow service delays every run's push, as it would each rank's). A body never holds one (step, rank) twice
(the service refuses such a batch whole), nor one rank under two incarnations (an in-process
rollback between a rank's batches): a batch that would goes into the next body.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Any

from healthsvc_client import encode
from healthsvc_client.delivery import Delivery
from healthsvc_client.retry import Backoff
from healthsvc_client.spool import SpoolWriter
from healthsvc_client.stats import Counters
from healthsvc_client.transport import HTTPTransport, Transport

logger = logging.getLogger("healthsvc.relay")

URGENT_GATHER_S = 0.02   # how long an urgent push waits for the host's other ranks
KEEP_PREPARED_S = 3600.0  # prepared bodies and tombstones older than this are swept


def _remove(file: str) -> None:
    try:
        os.unlink(file)
    except OSError:
        pass


class _Member:
    """One rank's connection: its batches are read on their own thread, answers sent from the
    flusher's."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.open = True

    def send(self, message: dict) -> bool:
        data = encode.encode_json(message) + b"\n"
        try:
            with self.lock:
                self.conn.sendall(data)
            return True
        except OSError:
            self.open = False
            return False

    def close(self) -> None:
        self.open = False
        try:
            self.conn.shutdown(socket.SHUT_RDWR)   # wakes its reader thread's recv
        except OSError:
            pass
        self.conn.close()


class Relay:
    """Accepts ranks on ``socket_path`` and pushes their records to ``url`` (see the module docstring).

    ``interval_s``: how long batches wait to be merged (a batch marked urgent, a rank's flush or
    close, is sent within ``URGENT_GATHER_S`` with what is pending then). ``max_records``: records per body.
    ``timeout_s`` and ``max_attempts`` (2 s, 3): one push gives up within about 7 s, before a
    rank's wait for it (``relay_timeout_s``, 10 s) runs out, so the rank hears ``failed`` and
    re-sends the body file itself instead of guessing.
    ``spool_path``: where bodies given up on are kept (as the rank's spool, for ``healthsvc
    sync``). ``pending_dir``: the prepared bodies (default ``<socket_path>.pending``).
    """

    def __init__(self, socket_path: str, url: str | None = None, *, interval_s: float = 0.5,
                 transport: Transport | None = None, spool_path: str | None = None,
                 pending_dir: str | None = None, max_records: int = 50_000, timeout_s: float = 2.0,
                 max_attempts: int = 3, gzip_min_bytes: int = 1024) -> None:
        if transport is None and not url:
            raise ValueError("the relay needs url='http://host:port' of the service")
        self.socket_path = socket_path
        self.interval_s = interval_s
        self.max_records = max_records
        self.pending_dir = pending_dir or socket_path + ".pending"
        os.makedirs(self.pending_dir, exist_ok=True)
        self.counters = Counters()
        self._warned: set[str] = set()
        self._swept_at = 0.0
        self._members: set[_Member] = set()
        self.batches_taken = 0   # ranks' batches handed to this relay (merged into sent_requests)
        self.delivery = Delivery(
            mode="online", transport=transport if transport is not None else HTTPTransport(url),  # type: ignore[arg-type]
            spool=SpoolWriter(spool_path) if spool_path else None, backoff=Backoff(),
            max_attempts=max_attempts, timeout_s=timeout_s, gzip_min_bytes=gzip_min_bytes,
            counters=self.counters, problem=self._problem)
        self._pending: dict[str, list[tuple[_Member, str, list]]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    def __repr__(self) -> str:
        return (f"Relay({self.socket_path!r}, batches_taken={self.batches_taken}, "
                f"sent_requests={self.counters.sent_requests})")

    def summary(self) -> str:
        """One line for the operator: how many of the ranks' batches went out in how many pushes."""
        c = self.counters
        return (f"merged {self.batches_taken} rank batches into {c.sent_requests} pushes "
                f"({c.sent_records} records; {c.rejected_requests} rejected, {c.failed_requests} failed, "
                f"{c.spooled_requests} spooled)")

    def _problem(self, key: str, message: str) -> None:
        self.counters.last_error = message
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("healthsvc relay: %s (further such problems are only counted)", message)

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Relay:
        """Bind the socket (replacing a stale one) and start the accept and flusher threads."""
        if os.path.exists(self.socket_path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.socket_path)
            except OSError:
                os.unlink(self.socket_path)   # a dead relay's socket: nobody answers on it
            else:
                raise RuntimeError(f"a relay already listens on {self.socket_path}")
            finally:
                probe.close()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.socket_path)
        server.listen(256)
        self._server = server
        for target, name in ((self._accept_main, "accept"), (self._flusher_main, "flusher")):
            thread = threading.Thread(target=target, daemon=True, name=f"healthsvc-relay-{name}")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Push what is pending (within ``timeout_s``), then close the socket."""
        self.delivery.deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._wake.set()
        self.delivery.interrupt.set()
        if self._server is not None:
            try:
                self._server.shutdown(socket.SHUT_RDWR)   # wakes the accept (close alone does not)
            except OSError:
                pass
            try:
                self._server.close()
            finally:
                try:
                    os.unlink(self.socket_path)
                except OSError:
                    pass
        for thread in self._threads:
            thread.join(timeout_s)
        with self._lock:
            members = list(self._members)
        for member in members:
            member.close()   # a rank still waiting hears EOF now and falls back at once

    # ---- ranks' connections ---------------------------------------------------------------------

    def _accept_main(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()  # type: ignore[union-attr]
            except OSError:
                return  # closed by stop()
            member = _Member(conn)
            with self._lock:
                self._members.add(member)
            threading.Thread(target=self._member_main, args=(member,), daemon=True,
                             name="healthsvc-relay-member").start()

    def _member_main(self, member: _Member) -> None:
        buffer = b""
        try:
            while True:
                chunk = member.conn.recv(1 << 16)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._take(member, line)
        except OSError:
            pass
        finally:
            member.close()   # its unprepared batches are dropped: the rank sends them itself
            with self._lock:
                self._members.discard(member)

    def _take(self, member: _Member, line: bytes) -> None:
        try:
            message = json.loads(line)
            batch_id, path, records = str(message["id"]), str(message["path"]), list(message["records"])
        except (ValueError, KeyError, TypeError) as exc:
            self._problem("protocol", f"ignored a malformed message: {exc!r}")
            return
        with self._lock:
            self._pending.setdefault(path, []).append((member, batch_id, records))
            self.batches_taken += 1
        if message.get("urgent"):
            self._wake.set()

    # ---- pushing --------------------------------------------------------------------------------

    def _flusher_main(self) -> None:
        while True:
            if self._wake.wait(self.interval_s) and not self._stop.is_set():
                # Urgent: ranks flush or finish together (after the same collective), so wait a
                # moment for the others and send them in one body.
                time.sleep(min(URGENT_GATHER_S, self.interval_s))
            self._wake.clear()
            stopping = self._stop.is_set()
            with self._lock:
                pending, self._pending = self._pending, {}
            for path, batches in pending.items():
                try:
                    self._push_run(path, batches)
                except Exception as exc:  # a bug here must not stop the relay for every rank
                    self._problem("flusher", f"flusher error: {exc!r}")
            if stopping:
                return

    def _push_run(self, path: str, batches: list[tuple[_Member, str, list]]) -> None:
        live = [b for b in batches if b[0].open]   # a closed rank already sent its own
        for group in _groups(live, self.max_records):
            self._push_group(path, group)

    def _push_group(self, path: str, group: list[tuple[_Member, str, list]]) -> None:
        records = [rec for _, _, recs in group for rec in recs]
        key = uuid.uuid4().hex
        body = {"batch_id": key, "columns": _columns(records)}
        file = os.path.join(self.pending_dir, key + ".json")
        with open(file, "wb") as fh:   # before any rank hears of it: "no file" means "stored"
            fh.write(encode.encode_json(body))
        for member, batch_id, _ in group:
            member.send({"id": batch_id, "prepared": file})
        outcome = self.delivery.send("POST", path, body, n_records=len(records))
        if outcome in ("sent", "spooled"):
            status = "done"   # accepted, or in this relay's spool
            _remove(file)
        elif outcome == "rejected":
            # Never stored: each rank posts its own records. The file becomes a tombstone first,
            # so a rank that did not hear this (its wait ran out) does not take "no file" for
            # "stored" (see RelayLink._resend_prepared); old tombstones are swept.
            status = "rejected"
            try:
                os.replace(file, file[: -len(".json")] + ".rejected")
            except OSError:
                pass
        else:
            status = "failed"   # the file stays: the ranks re-send it under the same key
        for member, batch_id, _ in group:
            member.send({"id": batch_id, "status": status})
        self._sweep()

    def _sweep(self, now: float | None = None) -> None:
        """Delete prepared bodies and tombstones older than ``KEEP_PREPARED_S`` (a failed body's
        ranks re-sent or spooled it long before; a relay that crashed left them), at most once a
        minute, so the pending directory does not grow with every failed interval."""
        now = time.time() if now is None else now
        if now - self._swept_at < 60.0:
            return
        self._swept_at = now
        try:
            names = os.listdir(self.pending_dir)
        except OSError:
            return
        for name in names:
            file = os.path.join(self.pending_dir, name)
            try:
                if now - os.path.getmtime(file) > KEEP_PREPARED_S:
                    os.unlink(file)
            except OSError:
                pass


def _groups(batches: list[tuple[Any, str, list]], max_records: int) -> list[list[tuple[Any, str, list]]]:
    """Split batches into bodies with unique (step, rank) keys, one incarnation per rank (a rank's
    records from before an in-process rollback and after it are two attempts') and at most
    ``max_records`` records (a single larger batch stays whole).

        >>> a = (None, "a", [{"step": 1, "rank": 0}]); b = (None, "b", [{"step": 1, "rank": 1}])
        >>> c = (None, "c", [{"step": 1, "rank": 0, "loss": 2.0}])
        >>> [[x[1] for x in g] for g in _groups([a, b, c], 100)]
        [['a', 'b'], ['c']]
        >>> d = (None, "d", [{"step": 5, "rank": 0, "incarnation": "x"}])
        >>> e = (None, "e", [{"step": 2, "rank": 0, "incarnation": "y"}])
        >>> [[x[1] for x in g] for g in _groups([d, e], 100)]
        [['d'], ['e']]
    """
    groups: list[list] = []
    keys: set[tuple[Any, Any]] = set()
    incarnations: dict[Any, Any] = {}
    size = 0
    for batch in batches:
        own = {(rec.get("step"), rec.get("rank")) for rec in batch[2]}
        own_inc = {rec.get("rank"): rec.get("incarnation") for rec in batch[2]}
        clash = any(incarnations.get(rank, inc) != inc for rank, inc in own_inc.items())
        if not groups or own & keys or clash or size + len(batch[2]) > max_records:
            groups.append([])
            keys, incarnations, size = set(), {}, 0
        groups[-1].append(batch)
        keys |= own
        incarnations.update(own_inc)
        size += len(batch[2])
    return groups


def _columns(records: list[dict]) -> dict[str, list]:
    """Rows to columns; a field a record lacks is None (``null``: not reported), NaN stays NaN.

        >>> _columns([{"step": 1, "rank": 0, "loss": float("nan")}, {"step": 1, "rank": 1, "lr": 0.1}])
        {'step': [1, 1], 'rank': [0, 1], 'loss': [nan, None], 'lr': [None, 0.1]}
    """
    names: dict[str, None] = {}
    for rec in records:
        names.update(dict.fromkeys(rec))
    return {name: [rec.get(name) for rec in records] for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m healthsvc_client.relay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("HEALTHSVC_URL"), help="service base URL (env HEALTHSVC_URL)")
    parser.add_argument("--socket", default=os.environ.get("HEALTHSVC_RELAY"), help="Unix socket path (env HEALTHSVC_RELAY)")
    parser.add_argument("--interval-s", type=float, default=0.5, help="merge window, seconds (default 0.5)")
    parser.add_argument("--spool", default=None, help="JSON-lines file for bodies given up on")
    parser.add_argument("--pending-dir", default=None, help="prepared bodies (default <socket>.pending)")
    args = parser.parse_args(argv)
    if not args.url or not args.socket:
        parser.error("--url and --socket (or HEALTHSVC_URL and HEALTHSVC_RELAY) are required")
    logging.basicConfig(level=logging.WARNING)
    relay = Relay(args.socket, args.url, interval_s=args.interval_s, spool_path=args.spool,
                  pending_dir=args.pending_dir).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"listening {args.socket}", flush=True)
    while not stop.wait(1.0):
        pass
    relay.stop()
    print(f"stopped: {relay.summary()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
