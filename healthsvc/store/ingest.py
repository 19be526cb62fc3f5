"""The metrics write path: accept a batch into the store, keeping each run's ingest state.

One job per accepted batch: deduplicate by the batch's digest, open a new attempt at a restart
(:class:`RunState`'s rules: a rank's new ``incarnation``, or, without one, a step that went
back), store a batch of an earlier attempt's processes in that attempt, record host changes, append one columnar chunk, and advance the run's :class:`RunState`
(after the SQL, which is what can fail). The usual push (plain progress) only claims its digest and
appends its chunk: :meth:`MetricsIngest._append_current`, one round trip on PostgreSQL. The run states are snapshotted now and then
(``snapshots``) and rebuilt on open from the snapshot and the chunks after it.

The store's ``store.ingest``, built with the store's writer (:class:`~healthsvc.store.seam.TableAccess`)
and a clock; it alone holds the runs' in-memory states: the control writes reach them through
:class:`~healthsvc.store.control.IngestRuns`, the reads and the findings through its public methods.
"""
from __future__ import annotations

import logging
import sqlite3
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import orjson

from healthsvc.store.batch import MetricBatch
from healthsvc.store import snapshots
from healthsvc.store.codec import encode_chunk
from healthsvc.store.errors import STORE_ERRORS
from healthsvc.store.quotas import Quotas, TooManyMetricNames, TooManyRuns, TooManyRunsOfToken, creator
from healthsvc.store.results import IngestResult, RunsReleased
from healthsvc.store.runstate import INCARNATION, Positions, RunState, RunView
from healthsvc.store.seam import Clock, TableAccess
from healthsvc.store.sharing import DatabaseSharing

log = logging.getLogger(__name__)

CHUNK_COLUMNS = ("run_id, attempt, step_min, step_max, n_records, n_points, fields, has_hosts, received_at,"
                 " payload")
CHUNK_PLACES = ", ".join("?" * len(CHUNK_COLUMNS.split(",")))
_NO_RANKS = np.empty(0, dtype=np.int64)   # read only: shared, never allocated per push


def chunk_row(run_id: str, attempt: int, batch: MetricBatch, now: float, payload: bytes) -> tuple:
    """The ``chunks`` row of a batch (``payload``: its :func:`encode_chunk`), in
    :data:`CHUNK_COLUMNS`' order."""
    return (run_id, attempt, *batch.step_bounds, len(batch), batch.n_points,
            ",".join([*batch.values, *batch.labels]), batch.host_index is not None, now, payload)


@dataclass(frozen=True)
class Appended:
    """What :meth:`MetricsIngest._append_current` did: the batch was a duplicate; or it is
    stored as chunk ``chunk_id``; or nothing, because another replica opened ``newer``
    (attempt, start step)."""
    duplicate: bool = False
    chunk_id: int | None = None
    newer: tuple[int, int] | None = None


class MetricsIngest:
    """The ingest and the run states, the store's ``store.ingest``. ``sharing``: whether other
    processes write the same runs (:mod:`~healthsvc.store.sharing`; their restarts are then read
    before each batch)."""

    def __init__(self, db: TableAccess, clock: Clock, *, quotas: Quotas, snapshot_every_s: float,
                 dedupe_window_s: float, sharing: DatabaseSharing) -> None:
        self._db = db
        self._clock = clock
        self.quotas = quotas
        self.snapshot_every_s = snapshot_every_s
        # How long a batch's idempotency key is remembered: retries come within minutes, and one
        # row per request kept forever would outgrow the data itself at thousands of ranks.
        self.dedupe_window_s = dedupe_window_s
        self._sharing = sharing
        self._last_prune = 0.0
        self._runs: dict[str, RunState] = {}   # the writer thread's
        self._last_snapshot: dict[str, float] = {}

    # -- what the store's other parts read (see ``reads``, ``findings``) ----------------------
    def state(self, run_id: str) -> RunState | None:
        """The run's live state, or None when it is not in memory: the writer thread's alone."""
        return self._runs.get(run_id)

    def held(self) -> int:
        """Runs whose state is in memory."""
        return len(self._runs)

    def states(self) -> Iterable[RunState]:
        """The states in memory (the writer thread's; a reader takes only what a race cannot
        break, such as the newest push time)."""
        return list(self._runs.values())

    def hosts_of(self, run_id: str, ranks: Sequence[int]) -> tuple[str | None, ...]:
        """Each rank's host as the run's state knows it, None where unknown (writer thread)."""
        st = self._runs.get(run_id)
        return st.hosts_of(ranks) if st is not None else (None,) * len(ranks)

    def submit_metrics(self, run_id: str, batch: MetricBatch, digest: str) -> Future:
        return self.run_job(run_id, lambda conn: self._ingest(conn, run_id, batch, digest))

    def ensure_run(self, conn: sqlite3.Connection, run_id: str, now: float) -> RunState:
        st = self._runs.get(run_id)
        if st is None:
            # Counted in the database: finished runs are let go from memory (release_run_states).
            if not conn.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() and \
                    conn.execute("SELECT count(*) FROM runs").fetchone()[0] >= self.quotas.max_runs:
                raise TooManyRuns(run_id, self.quotas.max_runs)   # before anything is written
            who = creator.get()
            self._check_token_runs(conn, run_id, who)
            cur = conn.execute("INSERT OR IGNORE INTO runs (run_id, created_at, updated_at, created_by) VALUES (?, ?, ?, ?)",
                               (run_id, now, now, who.token_id if who else None))
            st = self._runs[run_id] = RunState(run_id)
            if cur.rowcount == 0:
                # The run exists, but this store has no state of it: another replica wrote it
                # (a database shared by several). Its state is in the database: load it.
                (status,) = conn.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
                self._load_run_state(conn, run_id, status)
                st = self._runs[run_id]
        return st

    def _check_token_runs(self, conn: sqlite3.Connection, run_id: str, who) -> None:
        """Raise before anything is written when ``who`` has made its quota of runs and ``run_id``
        would be one more. Counted in the database (one indexed count, on a run's creation only):
        every replica and every restart sees the runs a token made anywhere."""
        limit = self.quotas.max_runs_per_token
        if who is None or limit <= 0:
            return
        (made,) = conn.execute("SELECT count(*) FROM runs WHERE created_by=?", (who.token_id,)).fetchone()
        if made >= limit and not conn.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone():
            raise TooManyRunsOfToken(run_id, who, limit)

    def _claim_names(self, run_id: str, st: RunState, batch: MetricBatch) -> None:
        """Count the batch's new field names against the run's quota (raises before anything is
        written). Claimed before the SQL: a job that fails after it leaves names counted that no
        chunk holds, until the next reload of the run states (a failed commit's) recounts them."""
        new = st.new_names(batch)
        if not new:
            return
        known = st.metric_names if st.metric_names is not None else set()
        if len(known) + len(new) > self.quotas.max_metric_names:
            raise TooManyMetricNames(run_id, new, len(known), self.quotas.max_metric_names)
        known.update(new)
        st.metric_names = known

    def newer_attempt(self, conn: sqlite3.Connection, run_id: str, st: RunState) -> tuple[int, int] | None:
        """(attempt, start step) of a restart another replica opened since this one last wrote
        the run, or None (:meth:`~healthsvc.store.sharing.DatabaseSharing.newer_attempt`)."""
        if st.attempt == 0:
            return None
        return self._sharing.newer_attempt(conn, run_id, st.attempt)

    def _ingest(self, conn: sqlite3.Connection, run_id: str, batch: MetricBatch, digest: str) -> IngestResult:
        now = self._clock()
        st = self.ensure_run(conn, run_id, now)
        self._claim_names(run_id, st, batch)
        # Encoded once: stored, and handed on with the result (a replica that does not own the
        # run sends these bytes to the owner).
        payload = encode_chunk(batch) if len(batch) else b""
        at = self._only_a_chunk(st, batch)
        if at is not None:
            appended = self._append_current(conn, run_id, st, batch, digest, now, payload)
            if appended.duplicate:
                return self._duplicate(conn, run_id, digest, st, now)
            if appended.chunk_id is not None:
                return self._applied(conn, run_id, st, batch, False, [], appended.chunk_id, now, payload, at=at)
            # Another replica opened a newer attempt (nothing was written): the batch joins that
            # attempt and goes the general way.
            assert appended.newer is not None
            st.join_attempt(*appended.newer)
        if not self._claim(conn, run_id, digest, len(batch), now):
            return self._duplicate(conn, run_id, digest, st, now)
        if len(batch) == 0:
            return IngestResult(run_id, 0, False, st.attempt, False, None, now, run=st.view())
        joined = self.newer_attempt(conn, run_id, st)
        if joined is not None:
            # Joining changes no row: a job that fails after it leaves the state a replica
            # that read the same attempt would have (a retry joins it again).
            st.join_attempt(*joined)
        older = self._incarnations_elsewhere(conn, run_id, st, batch)
        earlier = _earlier_attempt(batch, older)
        if earlier is not None:
            return self._store_in_earlier_attempt(conn, run_id, st, batch, earlier, now, payload)
        # First everything that can fail (the SQL), computed from the state without changing it;
        # then the in-memory state, which cannot fail. A failed job leaves both untouched.
        new_attempt = st.needs_new_attempt(batch, frozenset(older))
        attempt = st.attempt + 1 if new_attempt else st.attempt
        hosts = st.host_updates(batch)
        late = not new_attempt and st.late(batch)   # a gap filled late: no resume after a finish
        if new_attempt:
            # OR IGNORE: on a database shared by replicas, another one may have opened this
            # attempt (the same restart, seen there first); the batch joins it.
            conn.execute("INSERT OR IGNORE INTO attempts VALUES (?, ?, ?, ?)",
                         (run_id, attempt, batch.step_bounds[0], now))
        if hosts:
            conn.executemany("INSERT OR REPLACE INTO hosts VALUES (?, ?, ?)", [(run_id, r, h) for r, h in hosts])
        incarnations = st.new_incarnations(batch, new_attempt=new_attempt)
        if incarnations:
            conn.executemany("INSERT OR IGNORE INTO incarnations VALUES (?, ?, ?, ?)",
                             [(run_id, r, name, attempt) for r, name in incarnations])
        # The ranks this replica meets first in the attempt, for the run-wide finish.
        self._sharing.ranks_met(conn, run_id, attempt, st, batch, new_attempt, late)
        chunk_id = conn.execute(f"INSERT INTO chunks ({CHUNK_COLUMNS}) VALUES ({CHUNK_PLACES})",
                                chunk_row(run_id, attempt, batch, now, payload)).lastrowid
        if (st.finished or self._sharing.restart_reopens(st, new_attempt)) and not late:
            # Data after the run finished: it resumed. On a database shared by replicas another
            # replica may have taken the finish, unknown here: a restart (a new attempt after the
            # first) is the run running again wherever it is heard first.
            conn.execute("UPDATE runs SET status='running', finished_at=NULL, updated_at=? WHERE run_id=?",
                         (now, run_id))
        return self._applied(conn, run_id, st, batch, new_attempt, hosts, chunk_id, now, payload, late)

    def _incarnations_elsewhere(self, conn: sqlite3.Connection, run_id: str, st: RunState,
                                batch: MetricBatch) -> dict[str, int]:
        """Look up the incarnations the state does not know for their ranks (a restart, a
        process from before one, or a rank this replica has not met): the state learns those of
        the current attempt; returned are those of earlier attempts (incarnation -> attempt).
        One indexed read, only for a batch with such ranks (the first of each rank after a
        restart)."""
        misses = st.incarnation_misses(batch) if st.attempt else _NO_RANKS
        rows: list[tuple[int, str, int]] = []
        for at in range(0, len(misses), 500):
            part = misses[at:at + 500].tolist()
            rows += conn.execute(f"SELECT rank, incarnation, attempt FROM incarnations WHERE run_id=? AND rank IN"
                                 f" ({', '.join('?' * len(part))})", (run_id, *part)).fetchall()
        st.learn_incarnations([(int(r), name) for r, name, a in rows if a == st.attempt])
        return {name: int(a) for _, name, a in rows if a < st.attempt}

    def _store_in_earlier_attempt(self, conn: sqlite3.Connection, run_id: str, st: RunState, batch: MetricBatch,
                                  attempt: int, now: float, payload: bytes) -> IngestResult:
        """Records a process sent before the restart that ended its attempt, delivered late (its
        spool uploaded after the restart): stored in that attempt, so the history keeps them
        where they belong, and nothing of the current attempt changes. The result carries the
        earlier attempt: the live detectors, which judge the current one, pass it by."""
        chunk_id = conn.execute(f"INSERT INTO chunks ({CHUNK_COLUMNS}) VALUES ({CHUNK_PLACES})",
                                chunk_row(run_id, attempt, batch, now, payload)).lastrowid
        st.record_push(batch.step_bounds[1], len(batch), now, attempt=attempt)
        return IngestResult(run_id, len(batch), False, attempt, False, chunk_id, now, batch,
                            RunView(attempt, -1, 0, st.finished), payload)

    def _only_a_chunk(self, st: RunState, batch: MetricBatch) -> Positions | None:
        """The usual push: progress in the run's current attempt by ranks that have reported in
        it, on the hosts the run knows, while it runs. Nothing to store but the batch's claim and
        its chunk (:meth:`_append_current`; the state is only read). Returns where its ranks are
        in the run state (:meth:`RunState.progress_at`), None for any other batch."""
        if len(batch) == 0 or st.attempt == 0 or st.finished or st.finished_ranks:
            return None
        at = st.progress_at(batch)
        return None if at is None or st.host_updates(batch) else at

    def _append_current(self, conn: sqlite3.Connection, run_id: str, st: RunState, batch: MetricBatch,
                        digest: str, now: float, payload: bytes) -> Appended:
        """Claim the batch and append its chunk to the run's current attempt, unless another
        replica opened a newer attempt (then nothing is written: the general way claims it) or
        the batch is a duplicate. Here one statement each (SQLite's are in-process); the
        PostgreSQL store does it in one statement, which a lone push runs on its own."""
        newer = self.newer_attempt(conn, run_id, st)
        if newer is not None:
            return Appended(newer=newer)
        if not self._claim(conn, run_id, digest, len(batch), now):
            return Appended(duplicate=True)
        cur = conn.execute(f"INSERT INTO chunks ({CHUNK_COLUMNS}) VALUES ({CHUNK_PLACES})",
                           chunk_row(run_id, st.attempt, batch, now, payload))
        return Appended(chunk_id=cur.lastrowid)

    def _claim(self, conn: sqlite3.Connection, run_id: str, digest: str, n_records: int, now: float) -> bool:
        """Record the batch's digest; False if it was stored before (a retried push)."""
        return conn.execute("INSERT OR IGNORE INTO batches VALUES (?, ?, ?, ?)",
                            (run_id, digest, n_records, now)).rowcount > 0

    def _duplicate(self, conn: sqlite3.Connection, run_id: str, digest: str, st: RunState,
                   now: float) -> IngestResult:
        n = conn.execute("SELECT n_records FROM batches WHERE run_id=? AND digest=?", (run_id, digest)).fetchone()[0]
        return IngestResult(run_id, n, True, st.attempt, False, None, now, run=st.view())

    def _applied(self, conn: sqlite3.Connection, run_id: str, st: RunState, batch: MetricBatch,
                 new_attempt: bool, hosts: list[tuple[int, str]], chunk_id: int | None, now: float,
                 payload: bytes, late: bool = False, at: Positions | None = None) -> IngestResult:
        """The batch is stored: the run's in-memory state follows (it cannot fail), then the
        housekeeping (pruning the digests, a snapshot now and then). ``at``: the batch's ranks'
        positions when it is only progress (:meth:`_only_a_chunk`)."""
        first_step, last_step = batch.step_bounds
        if new_attempt:
            st.open_attempt(first_step)
        st.advance(batch, at)
        st.set_hosts(hosts)
        if not late:  # a rank that said finish and reports again has resumed (unless filling a gap)
            st.finished = False
            if st.finished_ranks:
                st.finished_ranks.difference_update(np.unique(batch.ranks).tolist())
        # Per-attempt progress and the last push are derivable from the chunks: kept in memory,
        # rebuilt from the chunks table on open, not written per batch.
        st.record_push(last_step, len(batch), now)
        if now - self._last_prune >= min(60.0, self.dedupe_window_s / 4):
            self._last_prune = now
            conn.execute("DELETE FROM batches WHERE received_at < ?", (now - self.dedupe_window_s,))
        if now - self._last_snapshot.get(run_id, 0.0) >= self.snapshot_every_s:
            # A snapshot is an optimisation: never fail the batch for it. Its own savepoint, so
            # a failed snapshot leaves the transaction usable (PostgreSQL aborts it otherwise).
            conn.execute("SAVEPOINT snapshot")
            try:
                self._write_snapshot(conn, run_id, st)
            except STORE_ERRORS:
                conn.execute("ROLLBACK TO snapshot")
                log.exception("snapshot of run %s failed; the next batch tries again", run_id)
            conn.execute("RELEASE snapshot")
        return IngestResult(run_id, len(batch), False, st.attempt, new_attempt, chunk_id, now, batch, st.view(),
                            payload)

    def _write_snapshot(self, conn: sqlite3.Connection, run_id: str, st: RunState) -> None:
        snapshots.write_snapshot(conn, run_id, "ingest", snapshots.newest_chunk_id(conn, run_id),
                                 orjson.dumps(st.to_dict()))
        self._last_snapshot[run_id] = self._clock()

    def snapshot_all(self, conn: sqlite3.Connection) -> None:
        """Snapshot every run's state (a job: the store's close)."""
        for run_id, st in self._runs.items():
            self._write_snapshot(conn, run_id, st)

    def reload(self, conn: sqlite3.Connection) -> None:
        """A group commit failed (disk full, I/O error): what the jobs changed in memory was not
        stored, so rebuild the in-memory run state from what is (runs, attempts, chunks), on
        the writer's connection ``conn``."""
        self._runs = {}
        self.load(conn)

    def run_job(self, run_id: str, fn: Callable[[sqlite3.Connection], Any]) -> Future:
        """A write that may create the run: if it fails, the run's row is rolled back with it,
        so the in-memory state must forget a run this job created (no phantom run that takes
        pushes but answers 404)."""
        who = creator.get()   # the request's, read here: the job runs on the writer thread

        def job(conn: sqlite3.Connection) -> Any:
            existed = run_id in self._runs
            mark = creator.set(who)
            try:
                return fn(conn)
            except BaseException:
                if not existed:
                    self._runs.pop(run_id, None)
                raise
            finally:
                creator.reset(mark)
        return self._db.write(job)

    def load(self, conn: sqlite3.Connection) -> None:
        """Rebuild each run's ingest state: its snapshot, then the chunks written after it."""
        for (run_id, status) in conn.execute("SELECT run_id, status FROM runs").fetchall():
            self._load_run_state(conn, run_id, status)

    def _load_run_state(self, conn: sqlite3.Connection, run_id: str, status: str) -> None:
        self._runs[run_id] = self.built_run_state(conn, run_id, status)

    def built_run_state(self, conn: sqlite3.Connection, run_id: str, status: str) -> RunState:
        """A run's ingest state as the database has it: its snapshot, then the chunks after it."""
        snap = snapshots.read_snapshots(conn, "ingest", run_id).get(run_id)
        attempts: dict[int, int] = {}

        def start_of(attempt: int) -> int:
            # Read again on a miss: on a database shared by replicas, a chunk read below may
            # have committed (with its attempt's row) after the attempts were read.
            if attempt not in attempts:
                attempts.update(conn.execute("SELECT attempt, start_step FROM attempts WHERE run_id=?", (run_id,)))
            return attempts[attempt]
        st = RunState(run_id)
        if snap is not None:
            try:
                st = RunState.from_dict(run_id, orjson.loads(snap.state))
            except Exception as exc:   # a form this release cannot read: the chunks tell it all
                snapshots.replaying_past("ingest", run_id, exc)
                snap = None
        for chunk in snapshots.chunks_after(conn, run_id, snap.watermark if snap else 0, fields={INCARNATION}):
            if chunk.attempt < st.attempt:
                continue   # records of an earlier attempt delivered late: its state is gone
            if chunk.attempt > st.attempt:
                st.attempt = chunk.attempt - 1
                st.open_attempt(start_of(chunk.attempt))
            st.advance(chunk.batch)
            st.set_hosts(st.host_updates(chunk.batch))
        st.finished = status == "finished"
        for attempt, last_step, n_records, last_push in conn.execute(
                "SELECT attempt, max(step_max), sum(n_records), max(received_at) FROM chunks WHERE run_id=?"
                " GROUP BY attempt", (run_id,)):
            st.attempt_progress[attempt] = [last_step, n_records]
            st.last_push = max(st.last_push or 0.0, last_push)
        st.metric_names = _stored_names(conn, run_id, st.metric_names, snap.watermark if snap else 0)
        return st

    def release_run_states(self, quiet_s: float) -> Future:
        """Let go of the ingest state of runs that are finished (the database's status: a
        finish accepted by another replica counts) and had no push here for ``quiet_s``: a
        snapshot is written first, so the next push (or a read, :meth:`run_view`) rebuilds the
        state from it at the cost of one read. The future's value, also handed to the store's
        listeners (the other holders of per-run memory): :class:`RunsReleased`."""
        def job(conn: sqlite3.Connection) -> RunsReleased:
            now = self._clock()
            quiet = [r for r, st in self._runs.items() if now - (st.last_push or 0.0) >= quiet_s]
            released: list[str] = []
            for at in range(0, len(quiet), 500):
                part = quiet[at:at + 500]
                finished = {r for (r,) in conn.execute(
                    f"SELECT run_id FROM runs WHERE status='finished' AND run_id IN ({', '.join('?' * len(part))})", part)}
                for run_id in part:
                    if run_id in finished:
                        self._write_snapshot(conn, run_id, self._runs[run_id])
                        del self._runs[run_id]
                        self._last_snapshot.pop(run_id, None)
                        released.append(run_id)
            return RunsReleased(tuple(released))
        return self._db.write(job)


def _stored_names(conn: sqlite3.Connection, run_id: str, known: set[str] | None, watermark: int) -> set[str]:
    """The run's field names: the snapshot's and those of the chunks after it (all of its chunks
    when the snapshot has none: an earlier release's, read once at its first start)."""
    after = watermark if known is not None else 0
    names = set(known or ())
    for (fields,) in conn.execute("SELECT DISTINCT fields FROM chunks WHERE run_id=? AND id>?", (run_id, after)):
        names.update(f for f in fields.split(",") if f)
    return names


def _earlier_attempt(batch: MetricBatch, older: dict[str, int]) -> int | None:
    """The earlier attempt a batch belongs to when every record of it was sent by an
    incarnation of an earlier attempt (``older``), else None (a batch that mixes them goes the
    usual way: a process's batch is never mixed; the client splits at a restart)."""
    label = batch.labels.get(INCARNATION)
    if not older or label is None:
        return None
    names, idx = label
    if (idx < 0).any():
        return None
    used = [names[i] for i in np.unique(idx).tolist()]
    if not all(name in older for name in used):
        return None
    return max(older[name] for name in used)
