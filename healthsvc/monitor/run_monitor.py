"""One run's live detection: its aligner and detector suite, fed by the monitor thread.

Everything here runs on one thread (the hub's), so detectors need no locks. A new attempt (steps
went back after a restart or rollback) resets the detectors and the aligner: detection restarts
from the resumed step (:meth:`RunMonitor.new_attempt`; what the ended attempt left waiting in the
aligner is judged first, and those findings are the ended attempt's). State round-trips through
:meth:`state_dict` for service restarts.

The run's attempt, the ranks seen in it and its finish are the store's
(:class:`~healthsvc.store.runstate.RunState`): each input brings the committed
:class:`~healthsvc.store.runstate.RunView`, and the monitor follows it rather than counting again.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from healthsvc_client.wire import INCARNATION_FIELD
from healthsvc_detectors.finding import Finding
from healthsvc.store.batch import MetricBatch
from healthsvc.monitor.aligner import StepAligner, batch_to_block
from healthsvc.monitor.suite import DetectorSuite, build_suite
from healthsvc.store.runstate import RunView

log = logging.getLogger(__name__)


class RunMonitor:
    def __init__(self, run_id: str, config: dict[str, Any], *, align_timeout_s: float = 5.0) -> None:
        self.run_id = run_id
        self.config = config
        self.suite: DetectorSuite = build_suite(config)
        self.aligner = StepAligner(timeout_s=align_timeout_s)
        self.attempt = 0
        self.watermark = 0            # id of the last stored chunk fed in
        self.world_size: int | None = config.get("world_size")
        self.ranks_seen = 0           # the store's count for the attempt, as last committed
        self.last_input_s = 0.0       # service clock of the last input (for restarts)
        # The run said finish (the store's word): silence is normal, and only data that the store
        # took as the run going on (a resume, a new attempt) re-opens it. Records committed before
        # the finish but fed after it (accepted by another replica, announced late; a gap filled)
        # and heartbeats (the store never resumes a run on them) leave it finished.
        self.finished = False

    def __repr__(self) -> str:
        return f"RunMonitor({self.run_id!r}, attempt={self.attempt}, detectors={list(self.suite.all())})"

    # -- inputs ---------------------------------------------------------------------------
    def expected_ranks(self) -> int:
        return int(self.world_size or self.ranks_seen or 1)

    def on_metrics(self, batch: MetricBatch, run: RunView, chunk_id: int | None, now: float) -> list[Finding]:
        """A committed batch of the current attempt; ``run`` is the run's state the store
        committed with it. A batch of a newer attempt needs :meth:`new_attempt` first (but the
        first attempt, which this opens: nothing came before it), so that what the ended attempt
        left is found in that attempt, not in this batch's."""
        out: list[Finding] = []
        if chunk_id is not None:
            self.watermark = max(self.watermark, chunk_id)
        if run.attempt < self.attempt:
            # Records of an earlier attempt's process, delivered late (its spool uploaded after
            # the restart): stored for the history; the detectors judge the current attempt.
            return out
        if run.attempt > self.attempt:
            if self.attempt:
                raise ValueError(f"run {self.run_id}: a batch of attempt {run.attempt} reached the "
                                 f"monitor of attempt {self.attempt}: call new_attempt first")
            self.new_attempt(run.attempt, now)
        elif self.finished and run.finished:
            return out + self._after_finish(batch, run, now)
        self.finished = False
        self.last_input_s = now
        self.ranks_seen = run.ranks_seen
        if "world_size" in batch.values:
            ws = batch.values["world_size"][batch.present["world_size"]]
            ws = ws[np.isfinite(ws)]
            if len(ws) and not self.config.get("world_size"):
                self.world_size = int(ws.max())
        batch = with_label_codes(batch)
        if self.suite.arrival:
            arrival_block = batch_to_block(batch.steps, batch.ranks, batch.values, batch.present)
            for det in self.suite.arrival.values():
                out += det.update(arrival_block)
        for watcher in self.suite.absence.values():
            out += watcher.observe(batch.ranks, batch.steps, now)
        for block in self.aligner.add(batch, now, self.expected_ranks()):
            out += self._aligned(block)
        return out

    def _after_finish(self, batch: MetricBatch, run: RunView, now: float) -> list[Finding]:
        """Records the store committed before the run's finish (or filling a gap), fed after it:
        the value detectors judge them (a NaN in the last step is still a NaN); the absence
        detectors do not see them, so the run stays finished and no silence after it is judged."""
        self.ranks_seen = run.ranks_seen
        self.last_input_s = max(self.last_input_s, now)
        batch = with_label_codes(batch)
        out: list[Finding] = []
        if self.suite.arrival:
            arrival_block = batch_to_block(batch.steps, batch.ranks, batch.values, batch.present)
            for det in self.suite.arrival.values():
                out += det.update(arrival_block)
        for block in self.aligner.add(batch, now, self.expected_ranks()):
            out += self._aligned(block)
        return out

    def _aligned(self, block) -> list[Finding]:
        out: list[Finding] = []
        for name, det in self.suite.aligned.items():
            try:
                out += det.update(block)
            except Exception:  # one broken detector must not blind the others
                log.exception("detector %s failed on run %s", name, self.run_id)
        return out

    def new_attempt(self, attempt: int, now: float) -> list[Finding]:
        """The run restarted: the steps the ended attempt left waiting in the aligner (the last
        ones its processes sent before they were stopped, often without every rank) are judged
        by its detectors, then every detector starts again. The findings returned belong to the
        ended attempt (:attr:`attempt` before this call): the caller records them there."""
        out: list[Finding] = []
        for block in self.aligner.flush_all():
            out += self._aligned(block)
        for det in self.suite.all().values():
            # Each detector says what a restart means to it (Detector.new_attempt): most start
            # again; resume_mismatch keeps what the abandoned attempt reported.
            det.new_attempt()
        self.aligner.reset()
        self.attempt = attempt
        self.finished = False   # a new attempt is the run going on
        return out

    def on_heartbeat(self, rank: int, step: int | None, phase: str | None, now: float) -> list[Finding]:
        self.last_input_s = now
        if self.finished:
            return []   # a heartbeat after finish (a rank's last, late) does not resume the run
        out: list[Finding] = []
        for det in self.suite.absence.values():
            out += det.heartbeat(rank, -1 if step is None else step, phase or "other", now)
        return out

    def on_finish(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for block in self.aligner.flush_all():
            out += self._aligned(block)
        for det in self.suite.absence.values():
            out += det.finish(now)
        self.finished = True
        self.last_input_s = max(self.last_input_s, now)   # quiet from here on (the hub lets go)
        return out

    def on_world_size(self, new_size: int, now: float) -> list[Finding]:
        """An elastic change: expect the new number of ranks, without alarms for departed ones."""
        self.world_size = new_size
        out: list[Finding] = []
        for det in self.suite.absence.values():
            out += det.set_world(range(new_size), now)
        return out

    def on_config(self, config: dict[str, Any]) -> None:
        """New detector parameters take effect at once; learned state is kept where it can be."""
        states = {name: det.state_dict() for name, det in self.suite.all().items()}
        self.config = config
        self.world_size = config.get("world_size") or self.world_size
        self.suite = build_suite(config)
        for name, det in self.suite.all().items():
            if name in states:
                try:
                    det.load_state_dict(states[name])
                except Exception:
                    det.reset()

    def tick(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for block in self.aligner.flush_due(now, self.expected_ranks()):
            out += self._aligned(block)
        for det in self.suite.absence.values():
            out += det.tick(now)
        return out

    # -- snapshot -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "watermark": self.watermark, "world_size": self.world_size,
                "finished": self.finished,
                "ranks_seen": self.ranks_seen, "last_input_s": self.last_input_s,
                "aligner": self.aligner.state_dict(),
                "detectors": {name: det.state_dict() for name, det in self.suite.all().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.attempt = state["attempt"]
        self.watermark = state["watermark"]
        self.world_size = state["world_size"]
        seen = state["ranks_seen"]  # a list of ranks in snapshots of earlier versions
        self.ranks_seen = len(seen) if isinstance(seen, list) else int(seen)
        self.last_input_s = state["last_input_s"]
        self.finished = bool(state.get("finished", False))   # absent in snapshots of earlier versions
        self.aligner.load_state_dict(state["aligner"])
        for name, det in self.suite.all().items():
            if name in state["detectors"]:
                det.load_state_dict(state["detectors"][name])

    def shift_clock(self, shift_s: float) -> None:
        """After a service restart, move absence timers forward by the downtime, so the time the
        service was down does not count as the ranks' silence."""
        for det in self.suite.absence.values():
            det.shift_clock(shift_s)


# String fields no detector judges: each rank's ``incarnation`` differs by design (the store reads it).
NOT_JUDGED = frozenset({INCARNATION_FIELD})


def with_label_codes(batch: MetricBatch) -> MetricBatch:
    """The batch with each string field (``param_digest``) added as a numeric column of codes
    (:meth:`MetricBatch.with_codes`), so the aligner and the detectors, which see numbers only,
    can compare digests across ranks. The ``incarnation`` is not judged (each rank's differs by
    design): the store reads it."""
    return batch.with_codes([name for name in batch.labels if name not in NOT_JUDGED])
