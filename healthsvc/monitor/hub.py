"""The monitor thread: routes committed input to each run's :class:`RunMonitor`, drives the
absence checks from a ticker, records findings, and snapshots detector state.

Input reaches it from the store's after-commit hook, through the pipeline (``healthsvc.pipeline``:
so detectors only ever see durable data) via a queue; the writer thread never waits on a detector. On start it restores each run's monitor from
its snapshot and replays the chunks stored after it, so a restarted service neither re-warms nor
repeats findings (stored findings are unique by identity).

With several replicas (:mod:`healthsvc.ownership`) the hub watches only the runs this
replica owns: a push to a run owned elsewhere is handed on to the owner (small chunks in the
notification, others read by id: :mod:`healthsvc.ownership.remote_chunks`; each tick also pulls the
chunks after its watermark, the replay path), and a run taken over from a dead replica is
restored the same way as at start, one run at a time. Every ownership change reaches the hub as a
message on its queue, so all of its state stays on its one thread.

The run's owner owns its alerts too (:class:`RunAlerts`, alerting's service): the findings it
records are folded into alerts on its thread before their job (the findings' stage), and the
hub, on its thread, tells alerting when a run is taken over or let go, ticks the alerts with its
own ticks, hands on a ``rollback`` event (accepted here or by another replica), and reloads a
run's alerts an operator changed through another replica.
"""
from __future__ import annotations

import functools
import json
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Union

import blosc2
import orjson

from healthsvc_detectors.finding import Finding
from healthsvc.findings import FindingsService
from healthsvc.messages import Drain, RunOwned, Stop, Tick, handle_in_order
from healthsvc.monitor import coalesce
from healthsvc.ownership import remote_chunks
from healthsvc.ownership import RemoteMessage, RunOwnership, SoleOwner
from healthsvc.monitor.run_monitor import NOT_JUDGED, RunMonitor
from healthsvc.store.interface import Store
from healthsvc.store.batch import MetricBatch
from healthsvc.store.results import IngestResult, RunEvent
from healthsvc.store.runstate import RunView
from healthsvc.store.snapshots import replaying_past

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemotePush:
    """Another replica accepted a push to a run this one owns (see ``RemoteMessage``)."""
    run_id: str
    message: RemoteMessage


@dataclass(frozen=True)
class FindingsUnstored:
    """A findings write of the run failed (:meth:`MonitorHub._stored`): record them again."""
    run_id: str
    attempt: int
    findings: list[Finding]
    at: float | None = None   # when the input that raised them arrived (see MonitorHub._record)


# What the monitor thread consumes: committed input from the store, and its own control messages.
MonitorInput = Union[IngestResult, RunEvent, RunOwned, RemotePush, FindingsUnstored, Tick, Drain, Stop]


class RunAlerts(Protocol):
    """What the run's owner does for its runs' alerts (alerting's
    :class:`~healthsvc.alerting.service.AlertingService`), called on the monitor thread."""

    def owned(self, run_id: str, gained: bool) -> None:
        """The run was taken over here (load its alerts, fold what its findings left) or let go
        (forget them); also called to reload a run's alerts changed on another replica."""

    def keeps_run(self, run_id: str) -> bool:
        """Whether a finished run's lease is still needed (a page or a resolution owed)."""

    def tick(self, now: float, asked: bool = False) -> None:
        """Do what is due at ``now`` (group intervals, resolve timeouts), without waiting."""

    def rolled_back(self, run_id: str, step: int) -> None:
        """The run resumed from the checkpoint at ``step``: resolve what that undid."""



# A snapshot holds the run's owner for as long as it takes, and that grows with the run: a
# 16,384-rank job's detector state took most of a second of this thread (bench/alert_latency.py
# --load --load-ranks 16384), during which nothing is judged and no page is folded. So a
# snapshot that took long is followed by a longer wait, SNAPSHOT_COST_RATIO times its cost:
# snapshots take at most 1/ratio of the owner's time whatever the run's size, and a page waits
# behind one rarely. A snapshot quicker than SNAPSHOT_COST_FLOOR_S keeps snapshot_every_s (a
# small run's interval does not follow the machine's noise). The price: a restart or a takeover
# replays the chunks of a longer interval (a 16,384-rank job: about 80 s of them).
SNAPSHOT_COST_RATIO = 100.0
SNAPSHOT_COST_FLOOR_S = 0.05


def snapshot_wait(every_s: float, cost_s: float) -> float:
    """How long after a snapshot that took ``cost_s`` the run's next one waits.

    >>> snapshot_wait(5.0, 0.002), snapshot_wait(5.0, 0.8)
    (5.0, 80.0)
    """
    return every_s if cost_s < SNAPSHOT_COST_FLOOR_S else max(every_s, SNAPSHOT_COST_RATIO * cost_s)


def _dump_state(state: dict) -> bytes:
    """The state as JSON text. Every part of it is strict JSON by contract: detectors write
    non-finite numbers as strings (``stats.state_json.array_to_json``; the conformance suite's
    ``snapshot`` fails a detector that does not), as does the aligner. So orjson's text is taken
    as it is: ~15x faster than the json module (a 1,024-rank run's state, 2.8 MB: 3.6 ms against
    55), where checking it by reading it back cost twice the writing again (6.7 ms to read, 1.5
    to compare: the snapshot was a sixth of the monitor thread's time under bench/ingest.py's
    1,024-record pushes). What orjson refuses (int keys, huge ints) the json module writes."""
    try:
        return orjson.dumps(state)
    except TypeError:
        return json.dumps(state, allow_nan=True, separators=(",", ":")).encode()


def _snapshot_blob(state: dict) -> bytes:
    """What a run's detector-state snapshot stores: the state's text (:func:`_dump_state`)
    compressed by LZ4 (blosc2). The store's writer, the thread every push waits on, writes it
    every ``snapshot_every_s`` for every run (and a replica sends it to PostgreSQL); compressed
    it is under a third of the bytes (``bench/monitor_snapshot.py``), for less CPU here than
    the writer saves. Text blosc2 does not take (past 2 GB) is stored as it is;
    :func:`_load_state` reads both."""
    text = _dump_state(state)
    try:
        return blosc2.compress(text, typesize=1, clevel=5, codec=blosc2.Codec.LZ4, filter=blosc2.Filter.NOFILTER)
    except (ValueError, RuntimeError):
        return text


def _load_state(blob: bytes) -> dict:
    """The state a snapshot holds: its text (as stored before, or too large to compress: a JSON
    object, so it starts with ``{``, which no blosc2 chunk does) or the text compressed. Read by
    orjson (a 16,384-rank run's state in a third of the json module's time), by the json module
    what orjson refuses (raw NaN tokens in snapshots of earlier versions, integers past 64 bits)."""
    text = blob if blob[:1] == b"{" else blosc2.decompress(blob)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


class MonitorHub:
    def __init__(self, store: Store, findings: FindingsService, *, clock: Callable[[], float] = time.time,
                 tick_interval_s: float = 1.0, snapshot_every_s: float = 5.0, align_timeout_s: float = 5.0,
                 ownership: RunOwnership | None = None, release_after_s: float = 0.0,
                 alerts: RunAlerts | None = None, cost_clock: Callable[[], float] = time.perf_counter) -> None:
        self.store = store
        self.ownership: RunOwnership = ownership or SoleOwner()
        # The runs' alerts: told (on this thread) when a run is taken over here or let go,
        # before the findings of its restore are recorded; ticked with the detectors.
        self.alerts = alerts
        self.findings = findings
        self.clock = clock
        self.tick_interval_s = tick_interval_s
        self.snapshot_every_s = snapshot_every_s
        self.align_timeout_s = align_timeout_s
        self.monitors: dict[str, RunMonitor] = {}
        self._next_snapshot: dict[str, float] = {}   # run -> when its next snapshot is due
        self._cost_clock = cost_clock
        # Which chunks each run's monitor was fed (see _seen), kept as the ownership says.
        self._fed = self.ownership.fed_chunks()
        self._queue: queue.Queue[MonitorInput | list[IngestResult | RunEvent]] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="healthsvc-monitor", daemon=True)
        self._ticker = threading.Thread(target=self._tick_loop, name="healthsvc-ticker", daemon=True)
        self._stopping = threading.Event()
        self.findings_recorded = 0
        # Findings raised but not stored (the lease was not this replica's for a moment, or the
        # write failed): run_id -> [(attempt, findings)], recorded again at the next tick while
        # the run is owned here (_record, _stored). A detector raises a finding once (a hang
        # fires once), so one dropped here would never be found again by this replica.
        self._unstored: dict[str, list[tuple[int, list[Finding], float | None]]] = {}
        self._recording: dict[str, Future] = {}   # run_id -> its last findings write
        self.findings_unstored = 0
        # Seconds from the arrival of the last input the detectors judged to their judging it:
        # ~0 live; a replay's (a restart's, a takeover's) is how old its data was; growing live,
        # the hub is behind its input (healthsvc_monitor_lag_seconds).
        self.lag_s = 0.0
        # run_id -> why its stored config was refused (the run runs on default detectors).
        self.config_errors: dict[str, str] = {}
        # Letting go of finished runs (see _release_quiet): after this long without input (0: never).
        # The lease goes only once the run's alerts no longer need it (alerts.keeps_run).
        self.release_after_s = release_after_s
        self._parked: set[str] = set()   # monitors let go whose lease a guard still needs
        self._store_released_at = 0.0
        self.runs_released = 0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._restore()
        self.ownership.start(on_gained=lambda run_id: self._queue.put(RunOwned(run_id, True)),
                             on_lost=lambda run_id: self._queue.put(RunOwned(run_id, False)),
                             on_remote=lambda run_id, msg: self._queue.put(RemotePush(run_id, msg)))
        self._thread.start()
        self._ticker.start()

    def stop(self) -> None:
        self._stopping.set()
        self._queue.put(Stop())
        self._thread.join(10)
        self._ticker.join(5)
        # The findings writes queued so far end first: a run whose findings were not all stored
        # gets no snapshot (_settled), so the next owner replays from before them and finds them.
        self.store.barrier().result(timeout=10)
        for run_id in list(self.monitors):
            if self.ownership.owns(run_id):
                self._snapshot(run_id, force=True)
        # The snapshots are durable before the leases go: the next owner starts from them.
        self.store.barrier().result(timeout=10)
        self.ownership.stop()

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything queued so far has been processed (for tests and shutdown);
        False if that took longer than ``timeout_s``."""
        barrier = Drain()
        self._queue.put(barrier)
        return barrier.done.wait(timeout_s)

    def tick(self, asked: bool = False) -> None:
        """Queue the absence checks (hang, stall, aligner timeouts) and the alerts' tick at the
        clock's time now (``asked``: by a drain, so the alerts tick whatever their interval)."""
        self._queue.put(Tick(self.clock(), asked))

    # -- input ----------------------------------------------------------------------------
    def committed(self, results: list[Any]) -> None:
        """A group commit's results (the pipeline's stage, on the writer thread): queue ours, in
        one queue put per group commit (``coalesce.unpacked`` spreads it out again)."""
        wanted: list[Any] = [res for res in results if isinstance(res, RunEvent)
                             or (isinstance(res, IngestResult) and not res.duplicate and res.batch is not None)]
        if wanted:
            self._queue.put(wanted)

    def _tick_loop(self) -> None:
        while not self._stopping.wait(self.tick_interval_s):
            self.tick()

    def _loop(self) -> None:
        while handle_in_order(coalesce.group_pushes(coalesce.unpacked(coalesce.take(self._queue))), self._route,
                              log, "monitor"):
            pass

    def _route(self, item: "MonitorInput | list[IngestResult]") -> None:
        if isinstance(item, list):
            self._pushes(item)
        else:
            self._handle(item)

    def _monitor(self, run_id: str) -> RunMonitor:
        mon = self.monitors.get(run_id)
        if mon is None:
            row = self.store.reads.get_run_row(run_id)
            config = row["config"] if row else {}
            mon = self.monitors[run_id] = self._new_monitor(run_id, config)
        return mon

    def _new_monitor(self, run_id: str, config: dict) -> RunMonitor:
        """A run's monitor; a stored config that no longer validates (written by an older
        version, or by hand) must not stop the service: the run is marked and watched with the
        default detector parameters."""
        try:
            mon = RunMonitor(run_id, config, align_timeout_s=self.align_timeout_s)
            self.config_errors.pop(run_id, None)
            return mon
        except Exception as exc:  # noqa: BLE001 - InvalidInput, or anything a detector raises
            why = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            log.error("run %s: stored config refused (%s); watching it with default detectors", run_id, why)
            self.config_errors[run_id] = why
            fallback = {k: config.get(k) for k in ("world_size",) if isinstance(config, dict)}
            return RunMonitor(run_id, fallback, align_timeout_s=self.align_timeout_s)

    def _handle(self, item: MonitorInput) -> None:
        if isinstance(item, Tick):
            for run_id, mon in list(self.monitors.items()):
                if not self.ownership.owns(run_id):
                    self._drop(run_id)
                    continue
                if run_id in self._unstored:
                    self._record_unstored(run_id)
                self.ownership.catch_up(run_id, self._pull)
                self._record(mon, mon.tick(item.now))
                self._snapshot(run_id)
            self._release_quiet(item.now)
            if self.alerts is not None:
                # On the clock now, not the tick's: a tick queued behind a busy hub (a takeover's
                # replay) is late, and alerts are timed by the wall clock.
                self.alerts.tick(self.clock(), item.asked)
            return
        if isinstance(item, RunOwned):
            if not item.gained:
                self._drop(item.run_id)
            elif self.ownership.owns(item.run_id):
                if item.run_id not in self.monitors:
                    self._adopt(item.run_id)
                else:  # the lease lapsed here and came back: alerting may have let the run go
                    self._alerts_owned(item.run_id, True)
            return
        if isinstance(item, RemotePush):
            self._remote(item)
            return
        if isinstance(item, FindingsUnstored):
            if item.run_id in self.monitors:
                self._unstored.setdefault(item.run_id, []).append((item.attempt, item.findings, item.at))
            else:   # let go meanwhile: its next owner restores from a snapshot taken before these
                log.warning("run %s: %d findings not stored; the run is no longer watched here",
                            item.run_id, len(item.findings))
            return
        if not self._claim(item):
            return
        ev: RunEvent = item   # pushes come grouped (_pushes)
        mon = self.monitors[ev.run_id]
        if ev.kind == "heartbeat":
            found = mon.on_heartbeat(ev.data["rank"], ev.data["step"], ev.data["phase"], ev.received_at)
        elif ev.kind == "finish":
            found = mon.on_finish(ev.received_at)
        elif ev.kind == "config":
            try:
                mon.on_config(ev.data)
                self.config_errors.pop(ev.run_id, None)
            except Exception:  # validated by PUT; anything else keeps the previous detectors
                log.exception("run %s: new config not applied", ev.run_id)
            found = []
        elif ev.kind == "event" and ev.data["kind"] == "world_size_change" and "new" in ev.data["data"]:
            found = mon.on_world_size(int(ev.data["data"]["new"]), ev.received_at)
        elif ev.kind == "event" and ev.data["kind"] == "rollback" and ev.data.get("step") is not None:
            if self.alerts is not None:   # latched alerts of corruption the rollback undid resolve
                self.alerts.rolled_back(ev.run_id, int(ev.data["step"]))
            found = []
        elif ev.kind == "alerts_changed":   # an operator changed its alerts through another replica
            self._alerts_owned(ev.run_id, True)   # (told by it, once stored): read them again
            found = []
        else:
            found = []
        self._record(mon, found, at=ev.received_at)

    def _pushes(self, pushes: list[IngestResult]) -> None:
        """A run's pushes of one attempt, queued together (:mod:`~healthsvc.monitor.coalesce`)."""
        if not self._claim(pushes[0]):
            for push in pushes[1:]:   # the first was handed on by _claim
                self.ownership.announce(push.run_id, remote_chunks.announcement(push))
            return
        self._feed_pushes(pushes)

    def _feed_pushes(self, pushes: list[IngestResult]) -> None:
        """Feed a claimed run's pushes to its monitor as one batch, but those the restore on
        claim replayed already."""
        mon = self.monitors[pushes[0].run_id]
        fresh = [p for p in pushes if p.chunk_id is None or not self._seen(p.run_id, mon, p.chunk_id)]
        if fresh:
            push = coalesce.merged(fresh, without=NOT_JUDGED)
            self._feed(mon, push.batch, push.run, push.chunk_id, push.received_at)

    def _feed(self, mon: RunMonitor, batch: MetricBatch, run: RunView, chunk_id: int | None, at: float) -> None:
        """Feed one committed batch to its run's monitor and record what it finds. A batch of a
        newer attempt first ends the monitor's: what that attempt left waiting is judged and
        recorded in it, never in the new one (a restart's first push must not carry the stopped
        processes' last steps into the attempt that replaced them)."""
        self.lag_s = max(0.0, self.clock() - at)
        if mon.attempt and run.attempt > mon.attempt:
            ended = mon.attempt
            self._record(mon, mon.new_attempt(run.attempt, at), attempt=ended, at=at)
        self._record(mon, mon.on_metrics(batch, self._finish_known(mon, run), chunk_id, at), at=at)

    # -- ownership ------------------------------------------------------------------------
    def _claim(self, item: IngestResult | RunEvent) -> bool:
        """Whether this replica watches the item's run; if another does, hand the push on."""
        run_id = item.run_id
        if not self.ownership.claim(run_id):
            self._drop(run_id)
            if isinstance(item, IngestResult):
                self.ownership.announce(run_id, remote_chunks.announcement(item))
            else:
                self.ownership.announce(run_id, {"event": item.kind, "data": item.data, "at": item.received_at})
            return False
        if run_id not in self.monitors:
            if self.ownership.restores(run_id, lambda: self.store.snapshot(run_id, "monitor") is not None):
                self._adopt(run_id)   # taken over, or let go here once it finished (_release_quiet)
            else:
                self._monitor(run_id)
        return True

    def _remote(self, item: RemotePush) -> None:
        msg = item.message
        if "event" in msg:
            # Handled as if accepted here (a config change is re-read: it may exceed a NOTIFY).
            data = msg.get("data") or {}
            if msg["event"] == "config":
                row = self.store.reads.get_run_row(item.run_id)
                data = row["config"] if row else data
            self._handle(RunEvent(item.run_id, msg["event"], data, float(msg.get("at") or self.clock())))
            return
        if self.ownership.owns(item.run_id):
            if item.run_id not in self.monitors:
                self._adopt(item.run_id)  # restore replays the announced chunks with the rest
            else:
                self._pull(item.run_id, msg)

    def _seen(self, run_id: str, mon: RunMonitor, chunk_id: int) -> bool:
        """Whether the chunk was fed already; records it as fed otherwise
        (:mod:`healthsvc.ownership.fed_chunks`: by the watermark with one writer, by the ids fed
        lately with several)."""
        return self._fed.seen(run_id, mon.watermark, chunk_id)

    def _pull(self, run_id: str, announced: RemoteMessage | None = None) -> None:
        """Feed the run's chunks not fed yet: the ones a notification announced (pushes accepted
        elsewhere; their ids may be below the watermark: they committed late), from the
        notification itself or read by id (``remote_chunks``); or, on a tick, all those after the
        watermark (what lost notifications did not bring)."""
        mon = self.monitors[run_id]
        if announced and announced.get("chunks"):
            chunks, missing = remote_chunks.inlined(announced)
            if missing:
                chunks = sorted([*chunks, *self.store.chunks_by_id(run_id, missing)], key=lambda c: c.id)
        else:
            chunks = self.store.chunks_after(run_id, self._fed.floor(run_id, mon.watermark))
        for chunk in chunks:
            if not self._seen(run_id, mon, chunk.id):
                self._feed(mon, chunk.batch, self._chunk_view(run_id, mon, chunk.attempt), chunk.id,
                           chunk.received_at)

    def _chunk_view(self, run_id: str, mon: RunMonitor, attempt: int) -> RunView:
        """The run's state for a chunk read back from the store (a replay, or a push accepted by
        another replica): its attempt, and the most ranks this replica's store or monitor knows
        of in it (the store keeps no count per chunk; see _restore_run)."""
        st = self.store.reads.run_view(run_id)
        seen = st.ranks_seen if st is not None and st.attempt == attempt else 0
        return RunView(attempt, -1, max(seen, mon.ranks_seen if mon.attempt == attempt else 0), False)

    def _finish_known(self, mon: RunMonitor, view: RunView) -> RunView:
        """The view a chunk is fed with, finished if the run still is. A chunk fed to a finished
        run's monitor may have committed before the finish (accepted by another replica and
        announced after the finish reached the owner; pulled by a tick), and this replica's own
        view does not know of a finish accepted elsewhere: the database's status says whether
        the run went on (an ingest that resumes a run sets it running in the chunk's own
        transaction). Read only for a finished monitor: rare."""
        if not mon.finished or view.finished or view.attempt != mon.attempt:
            return view
        row = self.store.reads.get_run_row(mon.run_id)
        if row is None or row["status"] != "finished":
            return view
        return RunView(view.attempt, view.start_step, view.ranks_seen, True)

    def _drop(self, run_id: str) -> None:
        """Forget a run another replica owns now (it writes the run's snapshots from here on)."""
        if self.monitors.pop(run_id, None) is not None:
            log.info("run %s is watched by another replica now", run_id)
            self._alerts_owned(run_id, False)
        self._next_snapshot.pop(run_id, None)
        self._fed.forget(run_id)
        self.findings.forget(run_id)
        self._recording.pop(run_id, None)
        if self._unstored.pop(run_id, None):   # the new owner restores from before them: found again there
            log.info("run %s: findings not stored are left to its new owner", run_id)

    def _record(self, mon: RunMonitor, found: list[Finding], attempt: int | None = None,
                at: float | None = None) -> None:
        """Store ``found`` in ``attempt`` (default: the monitor's current one). ``at``: when the
        input that raised them arrived (a push's or an event's receipt; None for what a tick
        found, now): their alerts are timed by it, so a fault replayed at once after a takeover or
        a restart is paged as it would have been live (a ten-step loss spike folded in a quarter
        of a second otherwise fires and clears inside its group's wait, and is never paged)."""
        if not found:
            return
        attempt = mon.attempt if attempt is None else attempt
        run_id = mon.run_id
        if not self.ownership.owns(run_id):
            # The lease ran out here a moment ago (a renewal late under load). The detector has
            # moved on as if this was stored (a hang fires once), so it is kept and recorded at
            # the next tick if the lease comes back; if another replica took the run, the run
            # is dropped with it and the new owner restores and finds these itself.
            self._unstored.setdefault(run_id, []).append((attempt, found, at))
            return
        # The blamed ranks' hosts are looked up by the store's job, on the thread that owns them.
        fut = self.findings.record(run_id, attempt, found, fence=self.ownership.fence(run_id), at=at)
        self._recording[run_id] = fut
        fut.add_done_callback(functools.partial(self._stored, run_id, attempt, found, at))
        self.findings_recorded += len(found)

    def _stored(self, run_id: str, attempt: int, found: list[Finding], at: float | None, fut: Future) -> None:
        """A findings write ended (on the writer thread): one that failed (its fence found the
        lease expired in the database, which happens when a renewal comes late; the store was
        down) goes back to the hub's thread, to be recorded again while the run is owned here."""
        exc = fut.exception()
        if exc is not None:
            self.findings_unstored += len(found)
            log.warning("run %s: %d findings not stored (%s); recorded again at the next tick if the run is "
                        "still watched here", run_id, len(found), exc)
            self._queue.put(FindingsUnstored(run_id, attempt, found, at))

    def _record_unstored(self, run_id: str) -> None:
        """Record again what could not be stored (:meth:`_record`, :meth:`_stored`); the run is
        owned here now. Findings are stored once by identity: one stored after all is skipped."""
        mon = self.monitors.get(run_id)
        for attempt, found, at in self._unstored.pop(run_id, []):
            if mon is not None:
                self._record(mon, found, attempt, at)

    def _settled(self, run_id: str) -> bool:
        """Whether every finding raised on the run is stored (none waiting to be recorded again,
        the last write done and not failed): only then may a snapshot say the detectors are past
        them, or a replica restoring from it would never find them."""
        if run_id in self._unstored:
            return False
        fut = self._recording.get(run_id)
        if fut is None:
            return True
        if not fut.done() or fut.exception() is not None:
            return False
        del self._recording[run_id]
        return True

    # -- snapshots ------------------------------------------------------------------------
    def _snapshot(self, run_id: str, force: bool = False) -> Any:
        """Save the run's detector state now and then (``force``: now); the store's future, or
        None when nothing was saved."""
        now = self.clock()
        if not force and now < self._next_snapshot.get(run_id, 0.0):
            return None
        if not self.ownership.owns(run_id) or not self._settled(run_id):
            return None
        mon = self.monitors[run_id]
        began = self._cost_clock()
        state = mon.state_dict()
        state["saved_at"] = now
        blob = _snapshot_blob(state)
        self._next_snapshot[run_id] = now + snapshot_wait(self.snapshot_every_s, self._cost_clock() - began)
        # Fenced: a replica that lost the run meanwhile must not overwrite the new owner's snapshot.
        return self.store.save_snapshot(run_id, "monitor", mon.watermark, blob, fence=self.ownership.fence(run_id))

    # -- letting go of finished runs --------------------------------------------------------
    def _release_quiet(self, now: float) -> None:
        """Let go of the runs that finished and had no input for ``release_after_s``: their
        detector state is saved (a snapshot) and dropped, and their lease released once no guard
        needs it (alerting: nothing owed to a receiver), so neither this replica nor a replica
        taking over holds a finished run. A run pushed to again is restored from its snapshot
        and the chunks after it, as a takeover is (``_claim``): finished is not hung, and a
        push after the finish is the run going on (a new attempt, or new steps)."""
        if self.release_after_s <= 0:
            return
        if now - self._store_released_at >= min(10.0, self.release_after_s / 2):
            # The store's ingest state of the finished runs this replica stored pushes of (owned
            # here or not): let go by the store, on its writer, by the same rule.
            self._store_released_at = now
            self.store.ingest.release_run_states(self.release_after_s)
        for run_id, mon in list(self.monitors.items()):
            if mon.finished and now - mon.last_input_s >= self.release_after_s and self._settled(run_id):
                self._release(run_id)
        for run_id in list(self._parked):
            self._release_lease(run_id)

    def _release(self, run_id: str) -> None:
        saved = self._snapshot(run_id, force=True)
        try:
            if saved is not None:
                saved.result(timeout=30)   # the next owner (or this one) restores from it
        except Exception:  # noqa: BLE001 - fenced out, or the store is down: keep it, try again
            log.warning("run %s: snapshot before letting go failed; kept", run_id, exc_info=True)
            return
        self.monitors.pop(run_id, None)
        self._next_snapshot.pop(run_id, None)
        self._fed.forget(run_id)
        self.findings.forget(run_id)   # its stored identities: read again if it comes back
        self._recording.pop(run_id, None)
        self.config_errors.pop(run_id, None)
        self.runs_released += 1
        log.info("run %s finished and quiet: its detector state is let go (kept in the store)", run_id)
        self.ownership.let_go(run_id, self._give_up)   # replicas: a lease to give up

    def _give_up(self, run_id: str) -> None:
        self._parked.add(run_id)
        self._release_lease(run_id)

    def _release_lease(self, run_id: str) -> None:
        if run_id in self.monitors or not self.ownership.owns(run_id):
            self._parked.discard(run_id)   # input came back, or the lease went elsewhere
            return
        if self.alerts is not None and self.alerts.keeps_run(run_id):
            return   # asked again at the next tick
        self._parked.discard(run_id)
        self._alerts_owned(run_id, False)   # alerting forgets the run's alerts
        self.ownership.release(run_id)

    def _alerts_owned(self, run_id: str, gained: bool) -> None:
        if self.alerts is not None:
            self.alerts.owned(run_id, gained)

    def held(self) -> dict[str, int]:
        """Per-run state this hub holds, by kind: monitors, leases kept for alerting after the
        monitor was let go, and the chunk bookkeeping of replicas (the memory test counts them)."""
        return {"monitors": len(self.monitors), "parked": len(self._parked), "fed": len(self._fed),
                "snapshot_times": len(self._next_snapshot), "config_errors": len(self.config_errors),
                "unstored": len(self._unstored)}

    def _restore(self) -> None:
        """At start: restore every run this replica owns (the sole owner: all of them)."""
        snapshots = self.store.snapshots("monitor")
        for row in self.store.reads.list_run_rows():
            if row["status"] == "finished" and row["run_id"] in snapshots and self.release_after_s > 0:
                continue   # let go (or to be): restored on its next input, from its snapshot (_claim)
            if self.ownership.owns(row["run_id"]):
                self._restore_run(row, snapshots.get(row["run_id"]))

    def _adopt(self, run_id: str) -> None:
        """A run this replica owns from now on: restored from its snapshot and later chunks."""
        row = self.store.reads.get_run_row(run_id)
        if row is None:
            return
        self._restore_run(row, self.store.snapshot(run_id, "monitor"))

    def _restore_run(self, row: dict, snapshot: Any) -> None:
        """Restore the run's monitor from its snapshot and the chunks after it: at start-up, on a
        takeover, when a run let go comes back; the steps in the order its ownership says
        (:meth:`~healthsvc.ownership.RunOwnership.restore`)."""
        r = _Restore(row, snapshot, self.clock())
        self.ownership.restore(r.run_id, _Steps(
            hand_over=functools.partial(self._hand_over, r), replay=functools.partial(self._replay, r),
            heartbeats=functools.partial(self._replay_heartbeats, r),
            finish=functools.partial(self._restore_finish, r),
            skip_downtime=functools.partial(self._skip_downtime, r)))
        log.info("restored monitor of run %s (replayed %d chunks, the last %.1f s after it arrived)",
                 r.run_id, r.replayed, self.lag_s if r.replayed else 0.0)

    def _hand_over(self, r: "_Restore") -> None:
        self._alerts_owned(r.run_id, True)

    def _replay(self, r: "_Restore") -> None:
        run_id, row = r.run_id, r.row
        mon = self.monitors[run_id] = self._new_monitor(run_id, row["config"])
        watermark = 0
        if r.snapshot is not None:
            watermark = r.snapshot.watermark
            try:
                state = _load_state(r.snapshot.state)
                mon.load_state_dict(state)
                r.saved_at = state.get("saved_at")
            except Exception as exc:
                replaying_past("monitor", run_id, exc)
                mon = self.monitors[run_id] = self._new_monitor(run_id, row["config"])
                watermark = 0
        # The store's run state (loaded before us) is what the replayed chunks led to: its
        # count of ranks is the one their blocks are aligned by (the counts at each chunk
        # are not kept; an attempt's ranks only grow, so early blocks may wait for their
        # timeout instead of completing at once: the findings are the same).
        st = self.store.reads.run_view(run_id)
        view = (RunView(st.attempt, st.start_step, st.ranks_seen, st.finished) if st is not None
                else RunView(0, -1, 0, row["status"] == "finished"))
        r.finished = view.finished or row["status"] == "finished"
        self._fed.restart(run_id, watermark)
        for chunk in self.store.chunks_after(run_id, watermark):
            if not self._seen(run_id, mon, chunk.id):
                chunk_view = RunView(chunk.attempt, -1, view.ranks_seen, False)
                self._feed(mon, chunk.batch, chunk_view, chunk.id, chunk.received_at)
                r.replayed += 1

    def _replay_heartbeats(self, r: "_Restore") -> None:
        # Heartbeats are stored as the newest per rank.
        mon = self.monitors[r.run_id]
        for hb in self.store.reads.heartbeats(r.run_id):
            if hb["ts"] > (r.saved_at or 0.0):
                self._record(mon, mon.on_heartbeat(hb["rank"], hb["step"], hb["phase"], hb["ts"]), at=hb["ts"])

    def _restore_finish(self, r: "_Restore") -> None:
        mon = self.monitors[r.run_id]
        if r.finished or r.row["status"] == "finished":
            self._record(mon, mon.on_finish(r.now))

    def _skip_downtime(self, r: "_Restore") -> None:
        # The service was down since its last input: that gap is not the ranks' silence.
        mon = self.monitors[r.run_id]
        last_seen = max(mon.last_input_s, r.saved_at or 0.0)
        if last_seen and r.now > last_seen:
            mon.shift_clock(r.now - last_seen)


@dataclass
class _Restore:
    """One run's restore as it goes (the hub's restore steps read and fill it)."""
    row: dict
    snapshot: Any
    now: float
    saved_at: float | None = None   # when the snapshot was taken
    finished: bool = False          # the store says the run finished (read by the replay)
    replayed: int = 0

    @property
    def run_id(self) -> str:
        return self.row["run_id"]


@dataclass(frozen=True)
class _Steps:
    """:class:`healthsvc.ownership.Restore`, bound to one run's restore."""
    hand_over: Callable[[], None]
    replay: Callable[[], None]
    heartbeats: Callable[[], None]
    finish: Callable[[], None]
    skip_downtime: Callable[[], None]
