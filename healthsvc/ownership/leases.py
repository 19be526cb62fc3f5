"""Run leases in PostgreSQL: which replica watches which run, with a fencing token.

A row of ``leases`` (the store's table) per run says who owns it (``owner``, a replica id), until when
(``expires_at``, the database's clock) and in which epoch (``token``, +1 at every change of hands).
A replica claims a run on its first activity there (:meth:`PgLeases.claim`: insert, or take the row
over once it expired); a background thread renews every lease it holds every ``ttl_s / 3`` and
sweeps expired leases of other replicas (a dead owner's runs are taken over within ``ttl_s`` even
when no push arrives, so a hang is still found) and running runs that have no lease at all (their
first push was stored by a replica that died before it claimed them). A replica counts a lease as its own only until
``ttl_s`` after the renewal that extended it was *sent* (its monotonic clock, less a margin), so it
stops acting before the database would let another replica take over.

Fencing: the owner's writes that must not come from a stale owner (snapshots, findings) carry the
lease's :class:`~healthsvc.store.fencing.Fence` (:meth:`PgLeases.fence`); the store checks it in
the write's own transaction (:mod:`healthsvc.store.fencing`).

Pushes accepted by a replica that does not own the run are handed to the owner with ``NOTIFY`` on
the owner's own channel (``hs_`` + its id), coalesced per run; the owner ``LISTEN``\\ s on a
connection of its own and feeds the announced chunks: small ones come in the notification, the
others it reads from the store by id (``healthsvc.ownership.remote_chunks``).

>>> channel("replica-7f3a"), channel("gpu-node-3:8081")
('hs_replica_7f3a', 'hs_gpu_node_3_8081')
"""
from __future__ import annotations

import json
import logging
import os
import queue
import re
import secrets
import socket
import threading
import time
from typing import Any, Callable

from healthsvc.ownership import remote_chunks
from healthsvc.ownership import RemoteMessage, Restore
from healthsvc.ownership.fed_chunks import FedChunks, RecentIds
from healthsvc.store import lease_table
from healthsvc.store.fencing import Fence

log = logging.getLogger(__name__)

# How long the first announcement waits for others to go with it: a few milliseconds of the
# 100 ms in which the owner must hear of a push.
NOTIFY_GATHER_S = 0.005
DEADLOCK_RETRIES = 3       # a renewal failed by PostgreSQL's deadlock check is run again this often
DEADLOCK_BACKOFF_S = 0.05  # ... after this long (times the attempt, jittered up to twice)


def channel(replica_id: str) -> str:
    """The NOTIFY channel a replica listens on (an SQL identifier: letters, digits, _)."""
    return "hs_" + re.sub(r"[^a-z0-9_]", "_", replica_id.lower())[:56]


def new_replica_id(port: int = 0) -> str:
    """A replica's id: its host and port, which one live process at a time can hold, so a
    replica restarted on them takes its leases back at once (the fencing token moves on);
    without a port, unique per process (its leases are taken over once they expire)."""
    if port:
        return f"{socket.gethostname()}:{port}"
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class PgLeases:
    """:class:`~healthsvc.ownership.RunOwnership` over the ``leases`` table (see the module)."""


    def __init__(self, dsn: str, *, ttl_s: float = 10.0, replica_id: str | None = None,
                 sweep_limit: int = 16, connect: Callable[..., Any] | None = None, port: int = 0) -> None:
        import psycopg

        self.dsn = dsn
        self.ttl_s = ttl_s
        self.replica_id = replica_id or new_replica_id(port)
        self.sweep_limit = sweep_limit
        self._connect = connect or (lambda: psycopg.connect(dsn, autocommit=True))
        # Acting stops this long before the database's expiry: clock rates and in-flight writes.
        self._margin_s = ttl_s / 10
        self._lock = threading.Lock()             # the lease connection and the maps below
        self._conn: Any = None
        self._held: dict[str, tuple[int, float]] = {}      # run -> (token, valid until, monotonic)
        self._others: dict[str, tuple[str, float]] = {}    # run -> (owner, ask again at, monotonic)
        self._outbox: queue.Queue[tuple[str, str, RemoteMessage] | None] = queue.Queue()
        self._stopping = threading.Event()
        self.listening = threading.Event()        # set once LISTEN is in place (tests wait on it)
        self._threads: list[threading.Thread] = []
        self._on_gained: Callable[[str], None] = lambda run_id: None
        self._on_lost: Callable[[str], None] = lambda run_id: None
        self._on_remote: Callable[[str, RemoteMessage], None] = lambda run_id, msg: None
        self.takeovers = 0
        self.notifications_sent = 0
        self.notifications_heard = 0

    def __repr__(self) -> str:
        return f"PgLeases({self.replica_id!r}, ttl_s={self.ttl_s}, held={len(self._held)})"

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, *, on_gained: Callable[[str], None], on_lost: Callable[[str], None],
              on_remote: Callable[[str, RemoteMessage], None]) -> None:
        self._on_gained, self._on_lost, self._on_remote = on_gained, on_lost, on_remote
        sent = time.monotonic()
        with self._lock:
            self._conn = self._connect()
            mine = self._conn.execute(lease_table.RECLAIM, {"me": self.replica_id, "ttl": self.ttl_s}).fetchall()
            for run_id, token in mine:
                self._held[run_id] = (int(token), sent + self.ttl_s - self._margin_s)
        for run_id, _ in mine:
            log.info("leases: %s took run %s back after a restart", self.replica_id, run_id)
            self._on_gained(run_id)
        for target, name in ((self._renew_loop, "leases"), (self._listen_loop, "leases-listen"),
                             (self._notify_loop, "leases-notify")):
            t = threading.Thread(target=target, name=f"healthsvc-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Release every lease (the other replicas take the runs at their next sweep) and stop."""
        self._stopping.set()
        self._outbox.put(None)
        for t in self._threads:
            t.join(5)
        with self._lock:
            held, self._held = self._held, {}
            try:
                if held and self._conn is not None:
                    self._conn.execute(lease_table.RELEASE, {"runs": list(held), "tokens": [t for t, _ in held.values()],
                                                  "me": self.replica_id})
            except Exception:
                log.exception("leases: release failed; they expire within %.0f s", self.ttl_s)
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- the protocol ---------------------------------------------------------------------
    def owns(self, run_id: str) -> bool:
        held = self._held.get(run_id)
        return held is not None and time.monotonic() < held[1]

    def fence(self, run_id: str) -> Fence | None:
        held = self._held.get(run_id)
        return Fence(run_id, self.replica_id, held[0]) if held is not None and self.owns(run_id) else None

    def held(self) -> dict[str, int]:
        now = time.monotonic()
        return {run: token for run, (token, until) in list(self._held.items()) if now < until}

    def claim(self, run_id: str) -> bool:
        if self.owns(run_id):
            return True
        other = self._others.get(run_id)
        if other is not None and time.monotonic() < other[1]:
            return False
        sent = time.monotonic()
        with self._lock:
            row = self._execute(lease_table.CLAIM, {"run": run_id, "me": self.replica_id, "ttl": self.ttl_s})
            if row is not None:
                self._held[run_id] = (int(row[0]), sent + self.ttl_s - self._margin_s)
                self._others.pop(run_id, None)
                log.info("leases: %s owns run %s (token %d)", self.replica_id, run_id, row[0])
                return True
            holder = self._execute(lease_table.HOLDER, (run_id,))
        if holder is not None:
            owner, remaining = holder
            self._others[run_id] = (owner, time.monotonic() + max(0.0, remaining))
        return False

    def release(self, run_id: str) -> None:
        """Let go of a finished, quiet run (the hub saved its state): nobody owns it, no sweep
        takes it while it stays finished, and its next activity on any replica claims it."""
        with self._lock:
            held = self._held.pop(run_id, None)
            if held is None:
                return
            try:
                self._execute(lease_table.RELEASE_FINISHED, {"run": run_id, "token": held[0], "me": self.replica_id})
            except Exception:  # it expires within ttl_s and is swept, restored and let go again
                log.exception("leases: release of run %s failed", run_id)
        log.info("leases: %s let go of finished run %s", self.replica_id, run_id)

    def tell_owner(self, run_id: str, message: RemoteMessage) -> None:
        """Hand ``message`` to the run's owner, whoever holds the lease now (none: nobody to tell,
        the next owner reads the store)."""
        with self._lock:
            holder = self._execute(lease_table.HOLDER, (run_id,))
        if holder is not None and holder[1] > 0 and holder[0] != self.replica_id:
            self._outbox.put((holder[0], run_id, message))

    def announce(self, run_id: str, message: RemoteMessage) -> None:
        other = self._others.get(run_id)
        if other is not None:
            self._outbox.put((other[0], run_id, message))

    # -- what replicas do differently (see RunOwnership) ------------------------------------
    def restores(self, run_id: str, let_go_here: Callable[[], bool]) -> bool:
        return True   # a run first owned here may have a history written by another replica

    def restore(self, run_id: str, steps: Restore) -> None:
        # Taken over from another replica: alerting loads the run's alerts first. The other
        # replicas accepted pushes and heartbeats all along, so the chunks replayed and the
        # newest heartbeat of each rank are the ranks' whole story, and a silence in them is
        # theirs (a hang is found within its timeout plus the lease TTL).
        steps.hand_over()
        steps.replay()
        steps.heartbeats()
        steps.finish()

    def catch_up(self, run_id: str, pull: Callable[[str], None]) -> None:
        pull(run_id)   # what a lost notification did not bring

    def fed_chunks(self) -> FedChunks:
        return RecentIds()

    def let_go(self, run_id: str, give_up: Callable[[str], None]) -> None:
        give_up(run_id)   # the lease goes once nothing of the run's owner needs it

    def holds_every_run(self) -> bool:
        return False

    def readiness(self) -> dict[str, Any]:
        """A replica's id and the runs it acts on now, said even when not ready: one cut off
        from the database shows it has let its leases go."""
        return {"replica": self.replica_id, "leases": self.held()}

    # -- threads --------------------------------------------------------------------------
    def _execute(self, sql: str, args: Any) -> Any:
        """One statement on the lease connection (reconnecting once if it broke); the lock is held."""
        for attempt in (0, 1):
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                return self._conn.execute(sql, args).fetchone()
            except Exception:
                if attempt:
                    raise
                log.warning("leases: connection lost; reconnecting", exc_info=True)
                self._conn = None
        return None

    def _renew_loop(self) -> None:
        while not self._stopping.wait(self.ttl_s / 3):
            try:
                self.renew()
            except Exception:  # the leases run out locally; acting stops before anyone takes over
                log.exception("leases: renewal failed")

    def renew(self) -> None:
        """Extend the held leases, learn which were lost, take over expired ones (the thread's beat)."""
        sent = time.monotonic()
        with self._lock:
            held = dict(self._held)
            kept: set[str] = set()
            if held:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                kept = self._renewed(held)
            gained = []
            if not self._stopping.is_set():
                self._conn.execute(lease_table.ADOPT_ORPHANS, {"ttl": self.ttl_s})
                gained = self._conn.execute(
                    lease_table.SWEEP, {"me": self.replica_id, "ttl": self.ttl_s, "limit": self.sweep_limit}).fetchall()
            until = sent + self.ttl_s - self._margin_s
            lapsed = {r for r in kept if held[r][1] <= sent}   # ran out here, but nobody took it
            for run_id in held.keys() - kept:
                self._held.pop(run_id, None)
            for run_id in kept:
                self._held[run_id] = (held[run_id][0], until)
            for run_id, token in gained:
                self._held[run_id] = (int(token), until)
                self._others.pop(run_id, None)
        for run_id in held.keys() - kept:
            log.warning("leases: %s lost run %s", self.replica_id, run_id)
            self._on_lost(run_id)
        for run_id in lapsed | {r for r, _ in gained}:
            if run_id not in lapsed:
                self.takeovers += 1
                log.info("leases: %s took run %s over", self.replica_id, run_id)
            self._on_gained(run_id)

    def _renewed(self, held: dict[str, tuple[int, float]]) -> set[str]:
        """RENEW the held leases; the runs whose lease is still this replica's. A deadlock is
        retried: the renewal updates many lease rows, while a store's group commit holds some
        of them ``FOR SHARE`` (its fenced writes, in the jobs' order) and waits for another;
        PostgreSQL breaks the cycle by failing one side, and a renewal that failed lets every
        lease run out here (the soak saw runs lost and taken over for it).

        The retry waits a moment first (:data:`DEADLOCK_BACKOFF_S`, jittered): retried at once,
        the renewal can lock the first row again before the fenced write it just released
        takes it, and the same cycle forms again with the fenced write as the one failed."""
        import psycopg

        args = {"runs": list(held), "tokens": [t for t, _ in held.values()], "ttl": self.ttl_s, "me": self.replica_id}
        for attempt in range(DEADLOCK_RETRIES + 1):
            try:
                return {r for (r,) in self._conn.execute(lease_table.RENEW, args).fetchall()}
            except psycopg.errors.DeadlockDetected:
                if attempt == DEADLOCK_RETRIES:
                    raise
                log.warning("leases: renewal deadlocked with a fenced write; renewing again")
                self._stopping.wait(DEADLOCK_BACKOFF_S * (attempt + 1) * (1.0 + secrets.randbelow(1000) / 1000))
        return set()

    def _listen_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn = self._connect()
                try:
                    conn.execute(lease_table.listen(channel(self.replica_id)))
                    self.listening.set()
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._heard(note.payload)
                finally:
                    conn.close()
            except Exception:
                if not self._stopping.wait(0.5):
                    log.exception("leases: listener failed; listening again")

    def _heard(self, payload: str) -> None:
        self.notifications_heard += 1
        try:
            msg = json.loads(payload)
            for item in msg:
                self._on_remote(item["run"], item["msg"])
        except Exception:
            log.exception("leases: bad notification %r", payload[:200])

    def _notify_loop(self) -> None:
        """Send the announcements: what queued up within :data:`NOTIFY_GATHER_S` of the first
        (and during the last send) goes in one notification per owner, each run's chunk
        announcements folded into one. (A notification is a transaction on the database and a
        wake-up on the owner: one per push cost more than the push's own insert.)"""
        conn = None
        while True:
            item = self._outbox.get()
            if item is None:
                break
            self._stopping.wait(NOTIFY_GATHER_S)
            batch = [item]
            while True:
                try:
                    nxt = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._outbox.put(None)
                    break
                batch.append(nxt)
            by_owner: dict[str, list[dict]] = {}
            chunks: dict[tuple[str, str], dict] = {}
            for owner, run_id, message in batch:
                if "chunks" in message and (owner, run_id) in chunks:
                    remote_chunks.fold(chunks[(owner, run_id)]["msg"], message)
                    continue
                entry: dict = {"run": run_id, "msg": message}
                if "chunks" in message:
                    entry["msg"] = {"chunks": []}   # a fresh message to fold this run's into
                    remote_chunks.fold(entry["msg"], message)
                    chunks[(owner, run_id)] = entry
                by_owner.setdefault(owner, []).append(entry)
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                for owner, items in by_owner.items():
                    for payload in _payloads(items):
                        conn.execute(lease_table.NOTIFY, (channel(owner), payload))
                        self.notifications_sent += 1
            except Exception:  # the owner's tick pulls the chunks anyway; events are retried never
                log.exception("leases: notification failed")
                conn = None
        if conn is not None:
            conn.close()


def _fitted(item: dict, limit: int) -> list[str]:
    """One announcement as JSON texts of at most ``limit`` bytes: as it is; else without its
    inline chunks (the owner reads them by id); else its chunk ids split in parts.

    >>> big = {"run": "r", "msg": {"chunks": list(range(3000)), "inline": {"1": [1, 0.0, "x" * 4000]}}}
    >>> parts = _fitted(big, 7900)
    >>> len(parts), sorted(c for p in parts for c in json.loads(p)["msg"]["chunks"]) == list(range(3000))
    (2, True)
    >>> any("inline" in json.loads(p)["msg"] for p in parts)
    False
    """
    text = json.dumps(item, separators=(",", ":"))
    msg = item["msg"]
    if len(text) <= limit or "chunks" not in msg:
        return [text]
    if msg.get("inline"):
        return _fitted({**item, "msg": {k: v for k, v in msg.items() if k != "inline"}}, limit)
    ids = msg["chunks"]
    if len(ids) < 2:
        return [text]
    half = len(ids) // 2
    return [*_fitted({**item, "msg": {**msg, "chunks": ids[:half]}}, limit),
            *_fitted({**item, "msg": {**msg, "chunks": ids[half:]}}, limit)]


def _payloads(items: list[dict], limit: int = 7900) -> list[str]:
    """JSON lists of items, each under NOTIFY's 8000-byte payload limit.

    >>> ps = _payloads([{"run": "r", "msg": {"chunks": [i]}} for i in range(1000)])
    >>> len(ps), sum(len(json.loads(p)) for p in ps), max(len(p) for p in ps) < 8000
    (5, 1000, True)
    """
    out: list[str] = []
    cur: list[str] = []
    size = 2
    for text in (t for item in items for t in _fitted(item, limit - 2)):
        if cur and size + len(text) + 1 > limit:
            out.append("[" + ",".join(cur) + "]")
            cur, size = [], 2
        cur.append(text)
        size += len(text) + 1
    if cur:
        out.append("[" + ",".join(cur) + "]")
    return out
