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
appended to that file; with ``mode="offline"`` everything goes there and ``clients.sync.upload_spool``
sends it later.

Fork: a child process (a data-loader worker) inherits a disabled copy: its calls are ignored and it
never touches the parent's threads, locks, sockets or spool file.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Literal

from clients import encode
from clients.queue import DropOldestQueue
from clients.retry import Backoff, is_retryable_status
from clients.spool import SpoolWriter
from clients.stats import ClientStats
from clients.transport import HTTPTransport, Request, Transport, TransportError
from clients.wire import API_PREFIX, EVENT_KINDS, HEARTBEAT_PHASES

logger = logging.getLogger("healthsvc.client")

Mode = Literal["online", "offline", "disabled"]
MODES: tuple[str, ...] = ("online", "offline", "disabled")

_live_runs: weakref.WeakSet[Run] = weakref.WeakSet()


class _Counters:
    """Mutable counters behind ``ClientStats``; each is written by one thread only."""

    def __init__(self) -> None:
        for name in ClientStats.__dataclass_fields__:
            if name not in ("pending", "last_error", "dropped"):
                setattr(self, name, 0)
        self.last_error: str | None = None


class _Phase:
    """Context manager returned by ``Run.phase``; a class, not a generator, to stay cheap."""

    __slots__ = ("_run", "_name", "_step", "_previous")

    def __init__(self, run: Run, name: str, step: int | None) -> None:
        self._run, self._name, self._step = run, name, step
        self._previous = "other"

    def __enter__(self) -> _Phase:
        self._previous = self._run._phase
        self._run._phase = self._name
        if self._step is not None:
            self._run._step_in_progress = self._step
        return self

    def __exit__(self, *exc: object) -> None:
        self._run._phase = self._previous


class Run:
    """One rank's connection to one run. Create it with ``clients.init``; see the module docstring.

    Arguments (times in seconds, sizes in items unless named ``_bytes``):
        url: service base URL, e.g. ``http://healthsvc:8000``. Unused in offline/disabled mode.
        run_id: the run's id, shared by all ranks of the job.
        rank: this process's global rank (>= 0).
        host, world_size: added to every record (host defaults to the hostname).
        mode: "online" (post), "offline" (spool to ``spool_path``), "disabled" (ignore every call).
        spool_path: JSON-lines file; required offline; online, requests given up on are kept there.
        config: run config sent once with ``PUT /v1/runs/{run_id}`` (send it from rank 0 only).
        transport: the seam for tests (``clients.transport.MockTransport``); default HTTP keep-alive.
        flush_interval_s: how long records wait to be batched (default 0.5 s).
        max_queue: queued items kept before the oldest are dropped.
        max_batch: records per request.
        heartbeat_interval_s: heartbeat period; 0 disables the heartbeat thread.
        timeout_s: per-request timeout.
        max_attempts: tries per request (1 = no retry).
        backoff_base_s, backoff_max_s: retry waits (see ``clients.retry.Backoff``).
        exit_flush_timeout_s: time the atexit flush may take when ``finish`` was not called.
        gzip_min_bytes: bodies at least this long are gzipped (negative: never).
    """

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
        self._control: DropOldestQueue[tuple[str, str, Any, int]] = DropOldestQueue(max_queue)
        self._counters = _Counters()
        self._warned: set[str] = set()

        self._held: tuple[int, float, dict] | None = None  # see _may_still_grow
        self._next_step = 0
        self._step_in_progress: int | None = None
        self._phase = "other"
        self._off = mode == "disabled"  # True: every call is ignored (counted)
        self._finished = False
        self._pid = os.getpid()
        self._new_sync_state()
        self._sender: threading.Thread | None = None
        self._heartbeat: threading.Thread | None = None
        _live_runs.add(self)

        if config is not None:
            self._enqueue_control("PUT", "", dict(config))
        if not self._off:
            self._start_threads()

    def _new_sync_state(self) -> None:
        self._wake = threading.Event()
        self._interrupt = threading.Event()
        self._closing = threading.Event()
        self._hb_stop = threading.Event()
        self._cond = threading.Condition()
        self._flush_requested = 0
        self._flush_done = 0
        self._deadline: float | None = None

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
            self._next_step = step + 1
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
                self._next_step = step + 1
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
        (see ``clients.digest``); returns the digest, or None when it could not be taken."""
        if self._off:
            self._counters.ignored_calls += 1
            return None
        try:
            from clients.digest import param_digest

            digest = param_digest(model_or_params, optimizer=optimizer)
            fields: dict[str, Any] = {"param_digest": digest}
            if replica_group is not None:
                fields["replica_group"] = int(replica_group)
            self.log(fields, step=max(self._next_step - 1, 0) if step is None else step)
            return digest
        except Exception as exc:  # never into the training loop
            self._problem("fingerprint", f"fingerprint() failed: {exc!r}")
            return None

    def phase(self, name: str, step: int | None = None) -> _Phase:
        """Context manager: the heartbeat reports ``name`` (data, compute, collective, checkpoint)
        while inside. ``step`` also sets the step the heartbeat reports as in progress."""
        if name not in HEARTBEAT_PHASES:
            self._problem("phase", f"unknown phase {name!r}; expected one of {HEARTBEAT_PHASES}")
        return _Phase(self, name, step)

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

    def checkpoint(self, step: int, uri: str, duration_s: float | None = None,
                   bytes: int | None = None) -> None:  # noqa: A002 - the wire field is "bytes"
        """Register a checkpoint holding the state after the update of ``step``."""
        body: dict[str, Any] = {"step": step, "uri": uri}
        if duration_s is not None:
            body["duration_s"] = duration_s
        if bytes is not None:
            body["bytes"] = bytes
        self._enqueue_control("POST", "/checkpoints", body)

    def event(self, kind: str, step: int | None = None, **data: Any) -> None:
        """Record a run event (restart, world_size_change, rollback, config_change, note)."""
        if kind not in EVENT_KINDS:
            self._problem("event", f"unknown event kind {kind!r}; expected one of {EVENT_KINDS}")
        # The rank and the trainer's clock go inside ``data``: the event body is {kind, step, data}.
        body = {"kind": kind, "step": step, "data": {**data, "rank": self.rank, "ts": time.time()}}
        self._enqueue_control("POST", "/events", body)

    def alert(self, message: str, severity: str = "warning", step: int | None = None,
              **data: Any) -> None:
        """A user-raised alert: an event of kind ``note`` with a severity (info, warning, critical)."""
        self.event("note", step=step, message=message, severity=severity, **data)

    def _enqueue_control(self, method: str, suffix: str, body: Any) -> None:
        if self._off:
            self._counters.ignored_calls += 1
            return
        self._control.put((method, suffix, body, 0))
        self._wake.set()

    # ---- lifecycle ----------------------------------------------------------------------------

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
        self._deadline = time.monotonic() + timeout_s
        self._closing.set()
        self._interrupt.set()
        self._wake.set()
        sender = self._sender
        if sender is not None:
            sender.join(timeout_s)
        if self._heartbeat is not None:
            self._heartbeat.join(0.1)
        if self._spool is not None:
            self._spool.close()
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

    def rollback_target(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """``GET /v1/runs/{run_id}/rollback`` on the calling thread: where to resume from.

        Returns the service's answer (``{"checkpoint": {"step", "uri"} | None, "onset": ..., "reason": ...}``)
        or None when offline, disabled, or the service cannot be reached. Never raises.
        """
        if self._transport is None:
            return None
        try:
            resp = self._transport.request(
                Request("GET", self._base_path + "/rollback", b"", {"Accept": "application/json"}),
                self.timeout_s if timeout_s is None else timeout_s)
            if resp.status != 200:
                self._problem("rollback", f"GET rollback answered {resp.status}: {resp.body[:200]!r}")
                return None
            answer = json.loads(resp.body)
            return answer if isinstance(answer, dict) else None
        except Exception as exc:
            self._problem("rollback", f"GET rollback failed: {exc!r}")
            return None

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

    # ---- sender thread ------------------------------------------------------------------------

    def _sender_main(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            with self._cond:
                generation = self._flush_requested
                force = generation > self._flush_done or self._closing.is_set()
            try:
                self._send_pending(force)
            except Exception as exc:  # a bug here must not kill delivery for the rest of the run
                self._problem("sender", f"sender error: {exc!r}")
            with self._cond:
                self._flush_done = max(self._flush_done, generation)
                self._cond.notify_all()
            if self._closing.is_set() and self._pending() == 0:
                return

    def _send_pending(self, force: bool) -> None:
        while True:
            rows = self._rows.drain(self.max_batch)
            if self._held is not None:
                rows.insert(0, self._held)
                self._held = None
            if not rows:
                break
            merged = encode.merge_by_step(rows)
            # Never hold a record back while a checkpoint/event/finish waits: it must not overtake
            # the records logged before it (a finish followed by records re-opens the run).
            if (not force and not len(self._rows) and not len(self._control)
                    and self._may_still_grow(merged)):
                self._held = merged.pop()
            if merged:
                self._send_rows(merged)
            if not len(self._rows):
                break
        while blocks := self._cols.drain(self.max_batch):
            self._send_columns(blocks)
        for method, suffix, body, _ in self._control.drain():
            self._deliver(method, self._base_path + suffix, body, n_records=0)

    def _may_still_grow(self, merged: list[tuple[int, float, dict]]) -> bool:
        """Hold back the newest step's record for one more interval when the training thread may
        still add fields to it (``log(loss=..)`` then ``log(grad_norm=..)``): the service reads a
        step a rank already reported as a restart, so one step must not straddle two batches.
        Never held: a record with a non-finite float (that is flushed now) or one older than the
        flush interval (a rank stuck after logging it)."""
        step, ts, metrics = merged[-1]
        if any(other[0] > step for other in merged):
            return False
        if any(v.__class__ is float and (v - v) != 0.0 for v in metrics.values()):
            return False
        return time.time() - ts < self.flush_interval_s

    def _send_rows(self, merged: list[tuple[int, float, dict]]) -> None:
        rank, host, world_size = self.rank, self.host, self.world_size
        records = []
        for step, ts, metrics in merged:
            record: dict[str, Any] = {"step": step, "rank": rank}
            for name, value in metrics.items():
                if value.__class__ in _JSON_SCALARS:
                    record[name] = value
                else:  # numpy scalars, tensors: converted here, off the training thread
                    try:
                        record[name] = encode.to_scalar(value)
                    except (TypeError, ValueError, RuntimeError):
                        self._counters.invalid_fields += 1
                        self._problem("invalid_field", f"dropped non-numeric field {name!r} at step {step}")
            if "ts" not in record:
                record["ts"] = ts
            if "host" not in record:
                record["host"] = host
            if world_size is not None and "world_size" not in record:
                record["world_size"] = world_size
            records.append(record)
        body = {"batch_id": uuid.uuid4().hex, "records": records}
        self._deliver("POST", self._base_path + "/metrics", body, n_records=len(records))

    def _send_columns(self, blocks: list[tuple[int, float, dict]]) -> None:
        converted = []
        for step, ts, block in blocks:
            cols = {name: _to_list(values) for name, values in block.items()}
            n = len(cols["rank"])
            if "step" not in cols:
                cols["step"] = [step] * n
            cols.setdefault("ts", [ts] * n)
            converted.append(cols)
        columns = encode.concat_columns(converted)
        body = {"batch_id": uuid.uuid4().hex, "columns": columns}
        self._deliver("POST", self._base_path + "/metrics", body, n_records=len(columns["rank"]))

    def _out_of_time(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _sleep_s(self, delay_s: float) -> bool:
        """Wait up to ``delay_s`` (cut short by the close deadline); False when out of time."""
        end = time.monotonic() + delay_s
        while True:
            now = time.monotonic()
            limit = end if self._deadline is None else min(end, self._deadline)
            if now >= limit:
                return not self._out_of_time()
            if self._interrupt.wait(limit - now):
                self._interrupt.clear()

    def _deliver(self, method: str, path: str, body: Any, n_records: int) -> bool:
        c = self._counters
        if self.mode == "offline":
            return self._to_spool(method, path, body, failed=False)
        try:
            payload, headers = encode.maybe_gzip(encode.encode_json(body), self.gzip_min_bytes)
        except (TypeError, ValueError) as exc:
            c.rejected_requests += 1
            self._problem("encode", f"could not encode a {path} body: {exc!r}")
            return False
        request = Request(method, path, payload, {"Content-Type": "application/json", **headers})
        retry_after: str | None = None
        for attempt in range(self.max_attempts):
            if attempt:
                if not self._sleep_s(self._backoff.delay_s(attempt - 1, retry_after)):
                    break
                c.retries += 1
            if self._out_of_time():
                break
            timeout_s = self.timeout_s
            if self._deadline is not None:
                timeout_s = max(0.001, min(timeout_s, self._deadline - time.monotonic()))
            retry_after = None
            try:
                response = self._transport.request(request, timeout_s)  # type: ignore[union-attr]
            except TransportError as exc:  # its message names the method and path
                self._problem("transport", str(exc))
                continue
            except Exception as exc:  # a transport bug is handled like a network error
                self._problem("transport", f"{method} {path}: {exc!r}")
                continue
            if 200 <= response.status < 300:
                c.sent_requests += 1
                c.sent_records += n_records
                return True
            if is_retryable_status(response.status):
                retry_after = response.header("Retry-After")
                self._problem(f"status{response.status}", f"{method} {path} answered {response.status}")
                continue
            c.rejected_requests += 1
            self._problem(f"status{response.status}",
                          f"{method} {path} rejected with {response.status}: {response.body[:300]!r}")
            return False
        c.failed_requests += 1
        c.failed_records += n_records
        if self._spool is not None:
            self._to_spool(method, path, body, failed=True)
        return False

    def _to_spool(self, method: str, path: str, body: Any, failed: bool) -> bool:
        try:
            self._spool.write(method, path, body)  # type: ignore[union-attr]
        except OSError as exc:
            self._problem("spool", f"could not write the spool: {exc!r}")
            if not failed:
                self._counters.failed_requests += 1
            return False
        self._counters.spooled_requests += 1
        return True

    # ---- heartbeat thread ---------------------------------------------------------------------

    def _heartbeat_main(self) -> None:
        suffix = self._base_path + "/heartbeats"
        while not self._hb_stop.is_set():
            body = {"rank": self.rank, "step": self.step_in_progress, "phase": self._phase}
            request = Request("POST", suffix, encode.encode_json(body),
                              {"Content-Type": "application/json"})
            try:
                # One attempt: a late heartbeat is worthless, the next one is due soon.
                response = self._transport.request(  # type: ignore[union-attr]
                    request, min(self.timeout_s, self.heartbeat_interval_s))
                ok = 200 <= response.status < 300
            except Exception as exc:
                self._problem("heartbeat", f"heartbeat failed: {exc!r}")
                ok = False
            if ok:
                self._counters.heartbeats_sent += 1
            else:
                self._counters.heartbeats_failed += 1
            self._hb_stop.wait(self.heartbeat_interval_s)

    # ---- fork -------------------------------------------------------------------------------------

    def _disable_in_forked_child(self) -> None:
        """Runs in a fresh child right after fork: forget the parent's threads, locks, sockets."""
        self._off = True
        self._finished = True
        self._sender = None
        self._heartbeat = None
        self._transport = None  # the parent's sockets: never read or close them from here
        self._spool = None
        self._new_sync_state()
        self._rows.clear()
        self._held = None
        self._cols.clear()
        self._control.clear()
        self._pid = os.getpid()


_JSON_SCALARS = frozenset({float, int, str, bool, type(None)})


def _to_list(values: Any) -> list:
    """A column as a list of JSON scalars (numpy arrays and tensors via ``tolist``)."""
    tolist = getattr(values, "tolist", None)
    if tolist is not None:
        detach = getattr(values, "detach", None)
        items = (detach().cpu() if detach is not None else values).tolist()
    else:
        items = list(values)
    return [v if v.__class__ in (int, float, str, bool) or v is None else encode.to_scalar(v)
            for v in items]


def _after_fork_in_child() -> None:
    for run in list(_live_runs):
        run._disable_in_forked_child()


def _flush_all_at_exit() -> None:
    for run in list(_live_runs):
        try:
            run._flush_at_exit()
        except Exception:  # never turn a clean exit into a traceback
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_flush_all_at_exit)


# Whoever imports the client gets the package's run API with it (``clients.stats`` is then the
# function, not the submodule of the same name).
import clients.api  # noqa: E402,F401
