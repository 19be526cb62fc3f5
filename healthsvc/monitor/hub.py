"""The monitor thread: routes committed input to each run's :class:`RunMonitor`, drives the
absence checks from a ticker, records findings, and snapshots detector state.

Input reaches it from the store's after-commit hook (so detectors only ever see durable data) via
a queue; the writer thread never waits on a detector. On start it restores each run's monitor from
its snapshot and replays the chunks stored after it, so a restarted service neither re-warms nor
repeats findings (stored findings are unique by identity).
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any, Callable, Union

from detectors.finding import Finding
from healthsvc.findings import FindingsService
from healthsvc.messages import Drain, Stop, Tick
from healthsvc.monitor.run_monitor import RunMonitor
from healthsvc.store.interface import Store
from healthsvc.store.results import IngestResult, RunEvent
from healthsvc.store.runstate import RunView

log = logging.getLogger(__name__)


# What the monitor thread consumes: committed input from the store, and its own control messages.
MonitorInput = Union[IngestResult, RunEvent, Tick, Drain, Stop]


def _dump_state(state: dict) -> bytes:
    # The json module keeps NaN/Infinity (detector state can hold them); orjson would write null.
    return json.dumps(state, allow_nan=True, separators=(",", ":")).encode()


class MonitorHub:
    def __init__(self, store: Store, findings: FindingsService, *, clock: Callable[[], float] = time.time,
                 tick_interval_s: float = 1.0, snapshot_every_s: float = 5.0, align_timeout_s: float = 5.0) -> None:
        self.store = store
        self.findings = findings
        self.clock = clock
        self.tick_interval_s = tick_interval_s
        self.snapshot_every_s = snapshot_every_s
        self.align_timeout_s = align_timeout_s
        self.monitors: dict[str, RunMonitor] = {}
        self._last_snapshot: dict[str, float] = {}
        self._queue: queue.Queue[MonitorInput] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="healthsvc-monitor", daemon=True)
        self._ticker = threading.Thread(target=self._tick_loop, name="healthsvc-ticker", daemon=True)
        self._stopping = threading.Event()
        self.findings_recorded = 0
        # run_id -> why its stored config was refused (the run runs on default detectors).
        self.config_errors: dict[str, str] = {}
        store.subscribe(self._after_commit)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._restore()
        self._thread.start()
        self._ticker.start()

    def stop(self) -> None:
        self._stopping.set()
        self._queue.put(Stop())
        self._thread.join(10)
        self._ticker.join(5)
        for run_id in list(self.monitors):
            self._snapshot(run_id, force=True)

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything queued so far has been processed (for tests and shutdown);
        False if that took longer than ``timeout_s``."""
        barrier = Drain()
        self._queue.put(barrier)
        return barrier.done.wait(timeout_s)

    def tick(self) -> None:
        """Queue the absence checks (hang, stall, aligner timeouts) at the clock's time now."""
        self._queue.put(Tick(self.clock()))

    # -- input ----------------------------------------------------------------------------
    def _after_commit(self, results: list[Any]) -> None:
        for res in results:
            if isinstance(res, IngestResult):
                if not res.duplicate and res.batch is not None:
                    self._queue.put(res)
            elif isinstance(res, RunEvent):
                self._queue.put(res)

    def _tick_loop(self) -> None:
        while not self._stopping.wait(self.tick_interval_s):
            self.tick()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, Stop):
                return
            if isinstance(item, Drain):
                item.done.set()
                continue
            try:
                self._handle(item)
            except Exception:
                log.exception("monitor failed on %r", type(item).__name__)

    def _monitor(self, run_id: str) -> RunMonitor:
        mon = self.monitors.get(run_id)
        if mon is None:
            row = self.store.get_run_row(run_id)
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

    def _handle(self, item: IngestResult | RunEvent | Tick) -> None:
        if isinstance(item, Tick):
            for run_id, mon in list(self.monitors.items()):
                self._record(mon, mon.tick(item.now))
                self._snapshot(run_id)
            return
        if isinstance(item, IngestResult):
            mon = self._monitor(item.run_id)
            self._record(mon, mon.on_metrics(item.batch, item.run, item.chunk_id, item.received_at))
            return
        ev: RunEvent = item
        mon = self._monitor(ev.run_id)
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
        else:
            found = []
        self._record(mon, found)

    def _record(self, mon: RunMonitor, found: list[Finding]) -> None:
        if not found:
            return
        # The blamed ranks' hosts are looked up by the store's job, on the thread that owns them.
        self.findings.record(mon.run_id, mon.attempt, found)
        self.findings_recorded += len(found)

    # -- snapshots ------------------------------------------------------------------------
    def _snapshot(self, run_id: str, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_snapshot.get(run_id, 0.0) < self.snapshot_every_s:
            return
        mon = self.monitors[run_id]
        state = mon.state_dict()
        state["saved_at"] = now
        blob = _dump_state(state)
        self._last_snapshot[run_id] = now
        self.store.save_snapshot(run_id, "monitor", mon.watermark, blob)

    def _restore(self) -> None:
        now = self.clock()
        snapshots = self.store.snapshots("monitor")
        for row in self.store.list_run_rows():
            run_id = row["run_id"]
            mon = self.monitors[run_id] = self._new_monitor(run_id, row["config"])
            watermark, saved_at = 0, None
            if run_id in snapshots:
                watermark = snapshots[run_id].watermark
                state = json.loads(snapshots[run_id].state)
                try:
                    mon.load_state_dict(state)
                    saved_at = state.get("saved_at")
                except Exception:
                    log.exception("monitor snapshot of run %s unreadable; replaying its history", run_id)
                    mon = self.monitors[run_id] = self._new_monitor(run_id, row["config"])
                    watermark = 0
            # The store's run state (loaded before us) is what the replayed chunks led to: its
            # count of ranks is the one their blocks are aligned by (the counts at each chunk
            # are not kept; an attempt's ranks only grow, so early blocks may wait for their
            # timeout instead of completing at once: the findings are the same).
            st = self.store.run_state(run_id)
            view = st.view() if st is not None else RunView(0, -1, 0, row["status"] == "finished")
            replayed = 0
            for chunk in self.store.chunks_after(run_id, watermark):
                chunk_view = RunView(chunk.attempt, -1, view.ranks_seen, False)
                self._record(mon, mon.on_metrics(chunk.batch, chunk_view, chunk.id, chunk.received_at))
                replayed += 1
            if view.finished:
                self._record(mon, mon.on_finish(now))
            # The service was down since its last input: that gap is not the ranks' silence.
            last_seen = max(mon.last_input_s, saved_at or 0.0)
            if last_seen and now > last_seen:
                mon.shift_clock(now - last_seen)
            log.info("restored monitor of run %s (replayed %d chunks)", run_id, replayed)
