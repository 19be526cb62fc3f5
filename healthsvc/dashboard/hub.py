"""Keeps every run's :class:`RunRollup` current: fed by committed ingest, on its own thread.

Like the monitor hub, it hears committed metrics from the store's after-commit hook through a
queue (the writer thread never waits on it), aligns per-rank pushes into complete steps with the
same :class:`StepAligner` the detectors use, and folds each aligned block into the run's rollup.
A ticker flushes steps that waited too long for missing ranks, so a live run's newest steps show
within a few seconds.

Restarts: a rollup is snapshotted into ``run_state`` (kind ``dashboard``, with the aligner's
pending records and the id of the last chunk folded in); on start the hub loads every running
run's and replays the chunks stored after it, in the background (``catching_up`` is true
meanwhile). A finished run is not held: it is read back from its snapshot when asked, and comes
back whole if it is pushed to again.
"""
from __future__ import annotations

import io
import logging
import queue
import threading
import time
from typing import Any, Callable

import numpy as np

from healthsvc_detectors.stats.state_json import array_from_json

from healthsvc.store.batch import MetricBatch
from healthsvc.messages import Drain, Flush, Stop, Tick, handle_in_order
from healthsvc.monitor import coalesce
from healthsvc.monitor.aligner import StepAligner
from healthsvc.store.interface import Store
from healthsvc.store.results import IngestResult, RunEvent, RunsReleased
from healthsvc.store.runstate import RunView
from healthsvc.store.snapshots import replaying_past
from healthsvc.dashboard.rollup import HEAT_FIELDS, LINE_FIELDS, RunRollup

log = logging.getLogger(__name__)

FIELDS = frozenset(LINE_FIELDS) | frozenset(HEAT_FIELDS)
# Records queued that end the wait between folds early. What waits is whole pushes, every field:
# at 600 pushes of 1,024 records a second, half a second of them is some 20 MB (300 pushes of
# 1,024 records of about 70 bytes), held and then freed at once, memory the process faulted in
# again and again. 65,536 records are about 4 MB; a fold of them still pays its fixed cost once
# for 64 such pushes (1 << 14 was no better in bench/ingest_inproc.py). The dashboard still
# causes the few page faults a push that bench/ingest_inproc.py counts; without it, none.
FOLD_AT_RECORDS = 1 << 16


class RunFeed:
    """One run's rollup and the aligner in front of it."""

    def __init__(self, align_timeout_s: float, world_size: int | None) -> None:
        self.rollup = RunRollup()
        # Complete steps go straight into the rollup (min_block_steps=1): the hub already folds
        # a run's pushes in batches (``fold_every_s``), so holding a few steps back for a fuller
        # block only delays them, and joins their records a second time in the next fold.
        self.aligner = StepAligner(timeout_s=align_timeout_s, min_block_steps=1)
        self.attempt = 0
        self.watermark = 0            # id of the last stored chunk folded in (or pending)
        self.world_size = world_size
        self.ranks_seen = 0           # the store's count for the attempt (its RunView)
        self.dirty = False

    def expected_ranks(self) -> int:
        return int(self.world_size or self.ranks_seen or 1)

    def add(self, batch: MetricBatch, run: RunView, chunk_id: int | None, now: float) -> None:
        """A committed batch; ``run`` is the run's state the store committed with it."""
        if run.attempt != self.attempt:
            self.flush_all()
            if run.start_step >= 0 and self.attempt:
                self.rollup.truncate(run.start_step)
            self.aligner.reset()
            self.attempt = run.attempt
        if chunk_id is not None:
            self.watermark = max(self.watermark, chunk_id)
        self.ranks_seen = run.ranks_seen
        for block in self.aligner.add(_slim(batch), now, self.expected_ranks()):
            self.rollup.add_block(block)
        self.dirty = True

    def add_pushes(self, pushes: list[IngestResult]) -> None:
        """A run's consecutive committed pushes of one attempt, fed as one batch (see
        ``healthsvc.monitor.coalesce``): the aligner joins a step's ranks whichever push brought
        them, so the rollup is the same, and its fixed cost per call is paid once. Pushes already
        replayed from the store on start are passed by."""
        fresh = [p for p in pushes if p.chunk_id is None or p.chunk_id > self.watermark]
        if not fresh:
            return
        chunk_ids = [p.chunk_id for p in fresh if p.chunk_id is not None]
        last = fresh[-1]
        # Only pushes that committed records are queued here (RollupHub's listener), and those
        # carry the run's state committed with them.
        batches = [p.batch for p in fresh if p.batch is not None]
        assert last.run is not None
        self.add(MetricBatch.concat(batches, only=FIELDS), last.run, max(chunk_ids) if chunk_ids else None,
                 last.received_at)

    def tick(self, now: float) -> None:
        for block in self.aligner.flush_due(now, self.expected_ranks()):
            self.rollup.add_block(block)
            self.dirty = True

    def flush_all(self) -> None:
        for block in self.aligner.flush_all():
            self.rollup.add_block(block)
            self.dirty = True

    # -- snapshot -------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        st = self.aligner.state_dict()
        arrays: dict[str, np.ndarray]
        arrays = {"rollup": np.frombuffer(self.rollup.to_bytes(), np.uint8),
                  "meta": np.array([self.attempt, self.watermark, st["emitted_upto"], st["late_records"]], np.int64),
                  "a_steps": np.asarray(st["steps"], np.int64), "a_ranks": np.asarray(st["ranks"], np.int64),
                  "a_first_step": np.asarray(st["first_seen_step"], np.int64),
                  "a_first_s": np.asarray(st["first_seen_s"], np.float64),
                  "ranks_seen": np.asarray(self.ranks_seen, np.int64)}
        for f in st["values"]:
            arrays[f"v:{f}"] = array_from_json(st["values"][f], np.dtype(np.float64))
            arrays[f"p:{f}"] = np.asarray(st["present"][f], bool)
        buf = io.BytesIO()
        np.savez(buf, allow_pickle=True, **arrays)   # numpy's default, named so no key can be it
        return buf.getvalue()

    def load_bytes(self, blob: bytes) -> None:
        with np.load(io.BytesIO(blob)) as z:
            self.rollup = RunRollup.from_bytes(z["rollup"].tobytes())
            self.attempt, self.watermark, emitted, late = (int(x) for x in z["meta"])
            fields = [n[2:] for n in z.files if n.startswith("v:")]
            self.aligner.load_state_dict({
                "steps": z["a_steps"], "ranks": z["a_ranks"],
                "values": {f: z[f"v:{f}"] for f in fields}, "present": {f: z[f"p:{f}"] for f in fields},
                "first_seen_step": z["a_first_step"], "first_seen_s": z["a_first_s"],
                "emitted_upto": emitted, "late_records": late})
            seen = z["ranks_seen"]  # the ranks themselves in snapshots of earlier versions
            self.ranks_seen = int(seen) if seen.ndim == 0 else len(seen)


def _slim(batch: MetricBatch) -> MetricBatch:
    """The batch's columns the rollups draw (no hosts or labels: nothing to merge by name)."""
    wanted = {f: v for f, v in batch.values.items() if f in FIELDS}
    return MetricBatch(batch.steps, batch.ranks, wanted, {f: batch.present[f] for f in wanted})


class RollupHub:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time, align_timeout_s: float = 5.0,
                 tick_interval_s: float = 1.0, snapshot_every_s: float = 30.0, fold_every_s: float = 1.0) -> None:
        self.fold_every_s = fold_every_s
        self.store = store
        self.clock = clock
        self.align_timeout_s = align_timeout_s
        self.tick_interval_s = tick_interval_s
        self.snapshot_every_s = snapshot_every_s
        self.feeds: dict[str, RunFeed] = {}
        self.lock = threading.Lock()  # readers (HTTP threads) vs the hub thread
        self.catching_up = True
        self._queue: queue.Queue[list[IngestResult | RunEvent | RunsReleased] | Tick | Flush | Drain | Stop] = \
            queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="healthsvc-dashboard", daemon=True)
        self._ticker = threading.Thread(target=self._tick_loop, name="healthsvc-dashboard-ticker", daemon=True)
        self._stopping = threading.Event()
        # Ends the wait between folds now (a drain or a stop asked for what is queued so far, or
        # FOLD_AT_RECORDS records are waiting).
        self._wake = threading.Event()
        self._queued_records = 0      # records queued since the fold began to wait (writer thread's count)
        self._last_snapshot: dict[str, float] = {}

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self._ticker.start()

    def stop(self) -> None:
        self._stopping.set()
        self._queue.put(Stop())
        self._wake.set()
        self._thread.join(30)
        self._ticker.join(5)
        for run_id in list(self.feeds):
            self._snapshot(run_id, force=True)

    def drain(self, timeout_s: float = 60.0) -> bool:
        """Wait until everything queued so far has been folded in (benchmarks, tests)."""
        barrier = Drain()
        self._queue.put(barrier)
        self._wake.set()
        return barrier.done.wait(timeout_s)

    def tick(self) -> None:
        """Queue the aligner's timeouts and due snapshots at the clock's time now."""
        self._queue.put(Tick(self.clock()))

    def flush(self, run_id: str) -> None:
        """Fold in a run's pending steps now (the run finished: nothing more will complete them)."""
        self._queue.put(Flush(run_id))

    # -- reading --------------------------------------------------------------------------
    def read(self, run_id: str, fn: Callable[[RunRollup], Any]) -> Any:
        """``fn(rollup)`` under the lock (None for an unknown run); keep ``fn`` to array slicing.
        A finished run not in memory (let go, see ``_handle``, or finished before this process
        started, see ``_restore``) is read back from its snapshot and the chunks stored after it,
        for this read, and not kept."""
        with self.lock:
            feed = self.feeds.get(run_id)
            if feed is not None:
                return fn(feed.rollup)
        row = self.store.reads.get_run_row(run_id)
        if row is None or row["status"] != "finished":
            return None
        snap = self.store.snapshot(run_id, "dashboard")
        feed = self._restored(row, snap.state if snap is not None else None)
        return fn(feed.rollup)

    # -- input ----------------------------------------------------------------------------
    def committed(self, results: list[Any]) -> None:
        """A group commit's results (the pipeline's stage, on the writer thread): queue ours."""
        # One hand-off per group commit, not one per push: a queue put wakes this thread (a
        # lock and a condition) and costs the writer thread more than the rest of this loop.
        wanted = [res for res in results
                  if (isinstance(res, IngestResult) and not res.duplicate and res.batch is not None)
                  or isinstance(res, RunsReleased)
                  or (isinstance(res, RunEvent) and res.kind in ("finish", "config"))]
        if wanted:
            self._queue.put(wanted)
            self._queued_records += sum(len(res.batch) for res in wanted
                                        if isinstance(res, IngestResult) and res.batch is not None)
            if self._queued_records >= FOLD_AT_RECORDS:
                self._queued_records = 0
                self._wake.set()

    def _tick_loop(self) -> None:
        while not self._stopping.wait(self.tick_interval_s):
            self.tick()

    def _loop(self) -> None:
        try:
            self._restore()
        except Exception:
            log.exception("dashboard rollups could not be restored; they fill from new data")
        self.catching_up = False
        while handle_in_order(coalesce.group_pushes(coalesce.unpacked(coalesce.take(self._queue))), self._handle_locked,
                              log, "dashboard rollup"):
            # The run page needs no fresher data than this (it polls every 3 s: its newest step
            # is at most 4 s old): pushes gather meanwhile and are folded in one go (one wake-up,
            # one aligned block for many pushes), instead of this thread waking per group commit
            # and contending with the event loop and the writer for the GIL. A drain or a stop
            # ends the wait. (1 s, not 0.5: 1.022-1.025x the requests per server CPU-second at
            # 64-record pushes, bench/ab_concurrent.py against the tree at 0.5.)
            self._wake.wait(self.fold_every_s)
            self._wake.clear()

    def _handle_locked(self, item: list[IngestResult] | RunEvent | RunsReleased | Tick | Flush) -> None:
        with self.lock:
            self._handle(item)

    def _feed(self, run_id: str) -> RunFeed:
        """The run's feed; one the hub does not hold is a new run's, or that of a run let go or
        not restored (finished) and now pushed to again: its rollup so far comes back from its
        snapshot and the chunks after it (the pushes being folded among them are passed by)."""
        feed = self.feeds.get(run_id)
        if feed is None:
            row = self.store.reads.get_run_row(run_id)
            snap = self.store.snapshot(run_id, "dashboard") if row is not None else None
            if row is not None and snap is not None:
                feed = self._restored(row, snap.state)
            else:
                feed = RunFeed(self.align_timeout_s, (row or {}).get("config", {}).get("world_size"))
            self.feeds[run_id] = feed
        return feed

    def _handle(self, item: list[IngestResult] | RunEvent | Tick | Flush | RunsReleased) -> None:
        if isinstance(item, RunsReleased):
            # The store let go of these finished, quiet runs: so does the dashboard, once their
            # rollups are in a snapshot (a read brings them back from it: read()).
            for run_id in item.run_ids:
                if run_id in self.feeds:
                    self.feeds[run_id].flush_all()
                    self._snapshot(run_id, force=True)
                    del self.feeds[run_id]
                self._last_snapshot.pop(run_id, None)
            return
        if isinstance(item, Tick):
            for rid, feed in list(self.feeds.items()):
                feed.tick(item.now)
                self._snapshot(rid)
            return
        if isinstance(item, Flush):
            if item.run_id in self.feeds:
                self.feeds[item.run_id].flush_all()
            return
        if isinstance(item, list):   # a run's pushes (coalesce.group_pushes)
            self._feed(item[0].run_id).add_pushes(item)
            return
        # A run's events reach the feed the hub holds, and make none: a feed only pushes made is
        # let go with the store's state of the run (RunsReleased), which its pushes loaded.
        held = self.feeds.get(item.run_id)
        if held is None:
            return
        if item.kind == "finish":
            held.flush_all()
        elif item.kind == "config":
            held.world_size = item.data.get("world_size") or held.world_size

    # -- snapshots ------------------------------------------------------------------------
    def _snapshot(self, run_id: str, force: bool = False) -> None:
        feed = self.feeds[run_id]
        now = self.clock()
        # A run's first snapshot too waits ``snapshot_every_s``, from the first tick that sees
        # it: until then a restart replays its chunks, as it does those after any snapshot, and
        # a short run is not compressed and written in its first second.
        if not feed.dirty or (not force and now - self._last_snapshot.setdefault(run_id, now) < self.snapshot_every_s):
            return
        blob, watermark = feed.to_bytes(), feed.watermark
        feed.dirty = False
        self._last_snapshot[run_id] = now
        try:
            self.store.save_snapshot(run_id, "dashboard", watermark, blob)
        except RuntimeError:  # the store is closing: the next start replays from the last snapshot
            log.warning("dashboard snapshot of run %s skipped: store closed", run_id)

    def _restore(self) -> None:
        """Every running run's feed, from its snapshot and the chunks after it. A finished run is
        not held: a read brings it back from its snapshot (:meth:`read`); one that has none yet
        (its process was stopped before its first) is rebuilt from its chunks once, here, and
        its snapshot written. (Held, a finished run would stay: on a replica the store lets go
        of a run, and so tells the hub, only if it loaded it.)"""
        snapshots = {r: snap.state for r, snap in self.store.snapshots("dashboard").items()}
        for row in self.store.reads.list_run_rows():
            run_id = row["run_id"]
            if row["status"] == "finished":
                if run_id not in snapshots:
                    feed = self._restored(row, None)
                    if feed.dirty:
                        self.store.save_snapshot(run_id, "dashboard", feed.watermark, feed.to_bytes())
                continue
            feed = self._restored(row, snapshots.get(run_id))
            with self.lock:
                self.feeds[run_id] = feed

    def _restored(self, row: dict, snapshot: bytes | None) -> RunFeed:
        """A run's feed from its snapshot and the chunks stored after it."""
        run_id = row["run_id"]
        feed = RunFeed(self.align_timeout_s, row["config"].get("world_size"))
        if snapshot is not None:
            try:
                feed.load_bytes(snapshot)
            except Exception as exc:
                replaying_past("dashboard", run_id, exc)
                feed = RunFeed(self.align_timeout_s, row["config"].get("world_size"))
        # As the monitor's replay: the store's run state is what the chunks led to (see
        # MonitorHub._restore); each attempt's first step is in its attempts table.
        starts = {a["attempt"]: int(a["start_step"]) for a in self.store.reads.attempts(run_id)}
        st = self.store.reads.run_view(run_id)
        seen = st.ranks_seen if st is not None else 0
        for chunk in self.store.chunks_after(run_id, feed.watermark, set(FIELDS)):
            feed.add(chunk.batch, RunView(chunk.attempt, starts.get(chunk.attempt, -1), seen, False),
                     chunk.id, chunk.received_at)
        if row["status"] == "finished":
            feed.flush_all()
        return feed
