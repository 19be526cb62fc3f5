"""The push client: one ``Run`` per rank process, a sender thread and a heartbeat thread behind it.

The training thread only appends to a bounded in-memory queue (a few microseconds); everything
that can be slow or fail (encoding, tensor-to-float conversion, gzip, HTTP, retries, the spool
file) happens on the sender thread. No method raises into the training loop: failures are counted
in ``stats()`` and logged once per kind on the ``healthsvc.client`` logger.

Lifecycle::

    run = Run("http://healthsvc:8000", "llama-7b-042", rank=3, world_size=64)
    for step in range(n):
        ...
        with run.phase("collective"):
            all_reduce(grads)            # a stuck rank's heartbeat says where it is stuck
        run.log(loss=loss, grad_norm=gn, step=step)
    run.finish()                         # flushes (with a time limit) and marks this rank done

Delivery: records are batched and posted every ``flush_interval_s`` (at once when a float value is
NaN/Inf, so a divergence is seen within a round trip). Retries back off exponentially with jitter
and honour ``Retry-After``; each metrics body carries a ``batch_id`` and is retried byte for byte,
so a server that deduplicates never counts a retried batch twice. When the queue is full the
oldest records are dropped (``stats().dropped``). With ``spool_path`` set, requests given up on are
appended to that file; with ``mode="offline"`` everything goes there and ``healthsvc_client.sync.upload_spool``
sends it later.

Fork: a child process (a data-loader worker) inherits a disabled copy: its calls are ignored and it
never touches the parent's threads, locks, sockets or spool file.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from healthsvc_client import registry
from healthsvc_client.control import Control
from healthsvc_client.delivery import Delivery
from healthsvc_client.heartbeat import Heartbeat, Phase
from healthsvc_client.queue import DropOldestQueue
from healthsvc_client.relay_link import RelayLink
from healthsvc_client.retry import Backoff
from healthsvc_client.sender import Sender
from healthsvc_client.spool import SpoolWriter
from healthsvc_client.stats import ClientStats, Counters
from healthsvc_client.transport import HTTPTransport, Transport
from healthsvc_client.wire import API_PREFIX, HEARTBEAT_PHASES, INCARNATION_FIELD

logger = logging.getLogger("healthsvc.client")

Mode = Literal["online", "offline", "disabled"]
MODES: tuple[str, ...] = ("online", "offline", "disabled")


class Run(Sender, Heartbeat, Control):
    """One rank's connection to one run. Create it with ``healthsvc_client.init``; see the module docstring.

    Arguments (times in seconds, sizes in items unless named ``_bytes``):
        url: service base URL, e.g. ``http://healthsvc:8000``. Unused in offline/disabled mode.
        run_id: the run's id, shared by all ranks of the job.
        rank: this process's global rank (>= 0).
        host, world_size: added to every record (host defaults to the hostname).
        mode: "online" (post), "offline" (spool to ``spool_path``), "disabled" (ignore every call).
        spool_path: JSON-lines file; required offline; online, requests given up on are kept there.
        config: run config sent once with ``PUT /v1/runs/{run_id}`` (send it from rank 0 only).
        transport: the seam for tests (``healthsvc_client.transport.MockTransport``); default HTTP keep-alive.
        flush_interval_s: how long records wait to be batched (default 0.5 s).
        max_queue: queued items kept before the oldest are dropped.
        max_batch: records per request.
        heartbeat_interval_s: heartbeat period; 0 disables the heartbeat thread.
        timeout_s: per-request timeout.
        max_attempts: tries per request (1 = no retry).
        backoff_base_s, backoff_max_s: retry waits (see ``healthsvc_client.retry.Backoff``).
        exit_flush_timeout_s: time the atexit flush may take when ``finish`` was not called.
        gzip_min_bytes: bodies at least this long are gzipped (negative: never).
        relay: the Unix socket of the host's relay (``healthsvc_client.relay``; ``init`` reads env
            ``HEALTHSVC_RELAY``): metrics rows go through it, one columnar push per host and
            interval; missing or dead, the rank posts directly. Online mode only.
        relay_timeout_s: how long the sender waits for the relay at each step of a hand-over
            before it posts directly.
    """

    _counters: Counters   # each mixin declares the counts it touches; the run holds them all

    def __init__(
        self,
        url: str | None,
        run_id: str,
        rank: int,
        host: str | None = None,
        world_size: int | None = None,
        *,
        mode: Mode = "online",
        spool_path: str | os.PathLike[str] | None = None,
        config: Mapping[str, Any] | None = None,
        transport: Transport | None = None,
        flush_interval_s: float = 0.5,
        max_queue: int = 10_000,
        max_batch: int = 1_000,
        heartbeat_interval_s: float = 5.0,
        timeout_s: float = 5.0,
        max_attempts: int = 6,
        backoff_base_s: float = 0.25,
        backoff_max_s: float = 30.0,
        exit_flush_timeout_s: float = 5.0,
        gzip_min_bytes: int = 1024,
        relay: str | os.PathLike[str] | None = None,
        relay_timeout_s: float = 10.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not run_id or not isinstance(run_id, str):
            raise ValueError("run_id must be a non-empty string shared by all ranks of the job, "
                             "e.g. init(url, run_id=os.environ['JOB_ID'], rank=...)")
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an int >= 0 (torch.distributed.get_rank()), got {rank!r}")
        if mode == "offline" and spool_path is None:
            raise ValueError("offline mode needs spool_path=..., the JSON-lines file to write")
        if mode == "online" and transport is None and not url:
            raise ValueError("online mode needs url='http://host:port' (or mode='offline' with "
                             "spool_path=..., or mode='disabled')")
        if max_attempts < 1 or max_queue < 1 or max_batch < 1 or flush_interval_s <= 0:
            raise ValueError("max_attempts, max_queue, max_batch must be >= 1 and "
                             "flush_interval_s > 0")
        self.url = url
        self.run_id = run_id
        self.rank = rank
        self.host = host if host is not None else socket.gethostname()
        self.world_size = world_size
        self.mode: Mode = mode
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.heartbeat_interval_s = heartbeat_interval_s
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.exit_flush_timeout_s = exit_flush_timeout_s
        self.gzip_min_bytes = gzip_min_bytes
        self._base_path = f"{API_PREFIX}/runs/{urllib.parse.quote(run_id, safe='')}"
        self._backoff = Backoff(backoff_base_s, backoff_max_s)

        self._transport: Transport | None = None
        if mode == "online":
            self._transport = transport if transport is not None else HTTPTransport(url)  # type: ignore[arg-type]
        self._spool = SpoolWriter(spool_path) if spool_path is not None else None

        self._rows: DropOldestQueue[tuple[int, float, dict]] = DropOldestQueue(max_queue)
        self._cols: DropOldestQueue[tuple[int, float, dict]] = DropOldestQueue(max_queue)
        # (method, path suffix, body, (rows put, column blocks put) before it: its place).
        self._control: DropOldestQueue[tuple[str, str, Any, tuple[int, int]]] = DropOldestQueue(max_queue)
        self._counters = Counters()
        self._warned: set[str] = set()
        self._delivery: Delivery | None = Delivery(
            mode=mode, transport=self._transport, spool=self._spool, backoff=self._backoff,
            max_attempts=max_attempts, timeout_s=timeout_s, gzip_min_bytes=gzip_min_bytes,
            counters=self._counters, problem=self._problem)
        self._relay: RelayLink | None = None
        if relay is not None and mode == "online":
            self._relay = RelayLink(os.fspath(relay), self._delivery, timeout_s=relay_timeout_s)

        self._held: tuple[int, float, dict] | None = None  # see _may_still_grow
        self._next_step = 0
        # Which process sends the records (the wire's ``incarnation``): new in each process and
        # whenever the steps go back, so the service tells a restart or rollback from records
        # that arrive late (a spool uploaded after an outage) by the trainer's word, not by step
        # numbers.
        self._incarnation = new_incarnation()
        self._step_in_progress: int | None = None
        self._phase = "other"
        self._off = mode == "disabled"  # True: every call is ignored (counted)
        self._finished = False
        self._pid = os.getpid()
        self._new_sync_state()
        self._sender: threading.Thread | None = None
        self._heartbeat: threading.Thread | None = None
        registry.track(self)

        if config is not None:
            self._enqueue_control("PUT", "", dict(config))
        if not self._off:
            self._start_threads()

    def _new_sync_state(self) -> None:
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._hb_stop = threading.Event()
        self._cond = threading.Condition()
        self._flush_requested = 0
        self._flush_done = 0

    def _start_threads(self) -> None:
        self._sender = threading.Thread(target=self._sender_main, daemon=True,
                                        name=f"healthsvc-sender-r{self.rank}")
        self._sender.start()
        if self.mode == "online" and self.heartbeat_interval_s > 0:
            self._heartbeat = threading.Thread(target=self._heartbeat_main, daemon=True,
                                               name=f"healthsvc-heartbeat-r{self.rank}")
            self._heartbeat.start()

    def __repr__(self) -> str:
        state = "finished" if self._finished else ("off" if self._off else self.mode)
        return f"Run(run_id={self.run_id!r}, rank={self.rank}, {state}, next_step={self._next_step})"

    # ---- training-thread API: cheap, never raises -------------------------------------------

    def log(self, metrics: Mapping[str, Any] | None = None, /, *, step: int | None = None,
            **fields: Any) -> None:
        """Queue one record for this rank: ``run.log({"loss": l}, step=s)`` or ``run.log(loss=l, step=s)``.

        ``step`` defaults to the previous step + 1 (0 first). Values may be floats, ints, numpy
        scalars or 0-d torch tensors (converted on the sender thread). Several calls for one step
        are merged into one record. A float NaN/Inf triggers an immediate flush.
        """
        if self._off:
            self._counters.ignored_calls += 1
            return
        try:
            if metrics is None:
                record = fields
            else:
                record = dict(metrics)
                if fields:
                    record.update(fields)
            if step is None:
                step = record.pop("step", None)
                if step is None:
                    step = self._next_step
            if step.__class__ is not int:
                step = int(step)
            if step < self._next_step - 1:   # the steps went back: an in-process rollback
                self._incarnation = new_incarnation()
            self._next_step = step + 1
            record[INCARNATION_FIELD] = self._incarnation
            self._rows.put((step, time.time(), record))
            self._counters.logged += 1
            for value in record.values():
                # (v - v) is 0.0 for a finite float and NaN for NaN/Inf: one test for both.
                if value.__class__ is float and (value - value) != 0.0:
                    self._wake.set()
                    break
            else:
                # Equality, not >=: one wake per batch; the sender drains everything it finds.
                if len(self._rows) == self.max_batch:
                    self._wake.set()
        except Exception as exc:  # a bad argument must not stop training
            self._problem("log", f"log() ignored a call: {exc!r}")

    def log_columns(self, columns: Mapping[str, Any], *, step: int | None = None) -> None:
        """Aggregator mode (typically rank 0): one block of records for many ranks at one step.

        ``columns`` maps field name to a sequence (list, numpy array or 1-d tensor) with one entry
        per rank, and must include ``"rank"``. ``step`` is broadcast unless ``columns`` has a
        ``"step"`` column. Sent as ``{"columns": {...}}``.

        Example: ``run.log_columns({"rank": [0, 1, 2, 3], "loss": gathered_losses}, step=10)``
        """
        if self._off:
            self._counters.ignored_calls += 1
            return
        try:
            block = dict(columns)
            if "rank" not in block:
                raise ValueError("columns must include a 'rank' column")
            if step is None and "step" not in block:
                step = self._next_step
            if step is not None:
                step = int(step)
                if step < self._next_step - 1:
                    self._incarnation = new_incarnation()
                self._next_step = step + 1
            block[INCARNATION_FIELD] = self._incarnation   # broadcast to the block's ranks when sent
            self._cols.put((-1 if step is None else step, time.time(), block))
            self._counters.columns_logged += 1
            if len(self._cols) == self.max_batch:
                self._wake.set()
        except Exception as exc:
            self._problem("log_columns", f"log_columns() ignored a call: {exc!r}")

    def fingerprint(self, model_or_params: Any, step: int | None = None, *, optimizer: Any = None,
                    replica_group: int | None = None) -> str | None:
        """Log this rank's replica fingerprint (``param_digest``) for ``step``: call it after the
        optimizer's update of ``step`` (the state a checkpoint at ``step`` would hold); ``step``
        defaults to the last logged step. Computed on the training thread, where the tensors are
        (see ``healthsvc_client.digest``); returns the digest, or None when it could not be taken.

        A loop that logs ``step``'s own record should put :meth:`fingerprint_fields` into that
        record instead: this separate ``log()`` may reach the service after the step's record
        was sent, and then the step has two records (the same incarnation sent both, so it is
        not taken for a restart, but the step's fields are split between them)."""
        if self._off:
            self._counters.ignored_calls += 1
            return None
        fields = self.fingerprint_fields(model_or_params, optimizer=optimizer, replica_group=replica_group)
        if not fields:
            return None
        self.log(fields, step=max(self._next_step - 1, 0) if step is None else step)
        return fields["param_digest"]

    def fingerprint_fields(self, model_or_params: Any, *, optimizer: Any = None,
                           replica_group: int | None = None) -> dict[str, Any]:
        """The fingerprint's fields (``param_digest``, ``replica_group``) without logging them, for
        a caller that logs them in the step's own record: a separate ``log()`` for a step whose
        record was already sent reaches the service as a second record of the step. ``{}`` when
        it could not be taken (never raises)."""
        if self._off:
            return {}
        try:
            from healthsvc_client.digest import param_digest

            fields: dict[str, Any] = {"param_digest": param_digest(model_or_params, optimizer=optimizer)}
            if replica_group is not None:
                fields["replica_group"] = int(replica_group)
            return fields
        except Exception as exc:  # never into the training loop
            self._problem("fingerprint", f"fingerprint() failed: {exc!r}")
            return {}

    def phase(self, name: str, step: int | None = None) -> Phase:
        """Context manager: the heartbeat reports ``name`` (data, compute, collective, checkpoint)
        while inside. ``step`` also sets the step the heartbeat reports as in progress."""
        if name not in HEARTBEAT_PHASES:
            self._problem("phase", f"unknown phase {name!r}; expected one of {HEARTBEAT_PHASES}")
        return Phase(self, name, step)

    def set_phase(self, name: str, step: int | None = None) -> None:
        """Set the heartbeat phase (and optionally the step in progress) without a ``with`` block."""
        self._phase = name
        if step is not None:
            self._step_in_progress = step

    @property
    def step_in_progress(self) -> int:
        """Step the heartbeat reports: the last one set by phase()/set_phase(), else last logged + 1."""
        explicit = self._step_in_progress
        return explicit if explicit is not None and explicit >= self._next_step else self._next_step


    def flush(self, timeout_s: float = 5.0) -> bool:
        """Send everything queued so far; True when it was delivered (or spooled) within ``timeout_s``."""
        if self._off or self._sender is None or not self._sender.is_alive():
            return False
        with self._cond:
            self._flush_requested += 1
            target = self._flush_requested
            self._wake.set()
            return self._cond.wait_for(lambda: self._flush_done >= target, timeout=timeout_s)

    def finish(self, timeout_s: float = 10.0) -> bool:
        """Flush, tell the service this rank finished (silence is then not a hang), stop threads.

        Waits at most ``timeout_s``; True when everything queued was delivered. Idempotent.
        """
        if self._off or self._finished:
            return False
        self._closing.set()  # before the finish is queued: the sender's next pass sends everything
        self._enqueue_control("POST", "/finish", {"rank": self.rank, "step": self._next_step - 1})
        return self._close(timeout_s)

    def _close(self, timeout_s: float) -> bool:
        self._finished = True
        self._off = True
        self._hb_stop.set()
        delivery = self._delivery
        if delivery is not None:
            delivery.deadline = time.monotonic() + timeout_s
            delivery.interrupt.set()
        self._closing.set()
        self._wake.set()
        sender = self._sender
        if sender is not None:
            sender.join(timeout_s)
        if self._heartbeat is not None:
            self._heartbeat.join(0.1)
        if self._spool is not None:
            self._spool.close()
        if self._relay is not None and (sender is None or not sender.is_alive()):
            self._relay.close()
        delivered = sender is not None and not sender.is_alive() and self._pending() == 0
        return delivered and self._counters.failed_requests == 0

    def _flush_at_exit(self) -> None:
        """atexit: flush within ``exit_flush_timeout_s``; no ``finish`` (an exit may be a crash)."""
        if not self._off and os.getpid() == self._pid:
            self._close(self.exit_flush_timeout_s)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.finish()
        else:
            # A crash is not a finish: keep the run "unfinished" so the silence that follows alarms.
            self.alert(f"training raised {exc_type.__name__}: {exc}", severity="critical",
                       step=self._next_step)
            self._close(self.exit_flush_timeout_s)

    def stats(self) -> ClientStats:
        """A snapshot of what was logged, sent, dropped, retried and failed."""
        c = self._counters
        values = {name: getattr(c, name) for name in vars(c)}
        values["dropped"] = self._rows.dropped + self._cols.dropped + self._control.dropped
        values["pending"] = self._pending()
        return ClientStats(**values)

    def _pending(self) -> int:
        held = 0 if self._held is None else 1
        return len(self._rows) + len(self._cols) + len(self._control) + held

    def _problem(self, key: str, message: str) -> None:
        self._counters.last_error = message
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("healthsvc client (run %s rank %d): %s (further such problems are "
                           "only counted, see run.stats())", self.run_id, self.rank, message)

    # ---- fork -------------------------------------------------------------------------------------

    def _disable_in_forked_child(self) -> None:
        """Runs in a fresh child right after fork: forget the parent's threads, locks, sockets."""
        self._off = True
        self._finished = True
        self._sender = None
        self._heartbeat = None
        self._transport = None  # the parent's sockets: never read or close them from here
        self._spool = None
        self._delivery = None
        self._relay = None      # the parent's relay connection, likewise
        self._new_sync_state()
        self._rows.clear()
        self._held = None
        self._cols.clear()
        self._control.clear()
        self._pid = os.getpid()


# Whoever imports the client gets the package's run API with it (``healthsvc_client.stats`` is then the
# function, not the submodule of the same name).
import healthsvc_client.api  # noqa: E402,F401


def new_incarnation() -> str:
    """A fresh ``incarnation`` id: 16 random hex digits (uuid4's randomness)."""
    return uuid.uuid4().hex[:16]
