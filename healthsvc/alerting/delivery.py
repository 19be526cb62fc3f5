"""The delivery worker: sends the outbox's due rows, at least once, with backoff.

Per attempt (``webhook-id`` is the row's, the same on every retry; the timestamp and signature are
made fresh, so a receiver's replay window holds for late retries):

- 2xx: ``delivered``.
- 5xx, 429, connection errors, timeouts: retried after ``Retry-After`` when the receiver sent one
  (seconds or an HTTP date), else after an exponential backoff with full jitter,
  ``uniform(0, min(cap_s, base_s * 2 ** (attempt - 1)))``. A delivery still failing
  ``max_age_s`` after it was enqueued goes ``dead`` with its last error (the last retry is
  scheduled no later than that deadline).
- any other answer (other 4xx, 3xx): ``failed`` with the error, no retry: the request is wrong and
  resending it will not fix it.

The worker is a thread with a small pool of sender threads and at most one attempt in flight
per subscription, so a receiver that hangs holds one sender, never the ones other subscriptions'
pages need (and a receiver gets its pages in order). The sender threads only send: each pass of
the worker's thread is ONE writer job that records the attempts finished since the last pass
(pulling a subscription's waiting rows forward when its receiver answered 2xx) and claims what
is due for the free senders. A page enqueued by a findings job is claimed in that job for this
worker when a sender is free and its subscription has no attempt in flight
(:meth:`DeliveryWorker.reserve`), and sent as soon as the job is durable
(:meth:`DeliveryWorker.take`): from a finding to its recorded delivery, the writer is crossed
twice. :meth:`DeliveryWorker.wake` makes it look at the outbox at once (new rows), and
:meth:`DeliveryWorker.stop` ends it cleanly, letting in-flight attempts finish (and recording them).

Example::

    >>> b = Backoff(base_s=0.5, cap_s=30.0)
    >>> import random; 0.0 <= b.delay_s(3, random.Random(0)) <= 2.0
    True
"""
from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import httpx

from healthsvc.alerting.address_policy import AddressPolicy

from healthsvc.store.outbox import Attempt, Delivery, Outbox
from healthsvc.alerting.signing import sign_headers

log = logging.getLogger(__name__)

USER_AGENT = "healthsvc-alerting/1"

# A page claimed in the job that enqueued it (``reserve``) is sent as soon as that job commits:
# its claim needs to outlast one attempt (``timeout_s``) by this much, not more (after a crash
# another worker takes it over once the claim ran out).
HAND_OFF_MARGIN_S = 2.0


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter (seconds)."""

    base_s: float = 1.0
    cap_s: float = 300.0

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Delay before retry number ``attempt`` (1 = after the first failure)."""
        return rng.uniform(0.0, min(self.cap_s, self.base_s * 2.0 ** max(attempt - 1, 0)))


def parse_retry_after(value: str | None, now: float) -> float | None:
    """``Retry-After`` in seconds from ``now``: delta-seconds or an HTTP date; None if absent/bad.

    >>> parse_retry_after("2", now=0.0), parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", now=4.0)
    (2.0, 6.0)
    """
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt did; ``retryable`` only matters when not ``delivered``."""

    delivered: bool
    retryable: bool
    status: int | None
    error: str | None
    retry_after_s: float | None = None


def classify(response: httpx.Response, now: float) -> AttemptResult:
    code = response.status_code
    if 200 <= code < 300:
        return AttemptResult(True, False, code, None)
    # Status and reason phrase only: the receiver's body is not ours to show (it may hold secrets
    # of the network it lives in, and last_error is readable through the API).
    error = f"HTTP {code} {response.reason_phrase}".strip()
    if code == 429 or code >= 500:
        return AttemptResult(False, True, code, error, parse_retry_after(response.headers.get("retry-after"), now))
    return AttemptResult(False, False, code, error)


class DeliveryWorker:
    """Sends due outbox rows until stopped.

    ``clock`` gives unix seconds (injectable for tests); ``rng`` drives the jitter;
    ``transport`` is an optional httpx transport (tests may use a mock one); ``on_attempt`` is
    called after each attempt with the delivery and its result (metrics hook); ``headers_for``
    gives a subscription's own headers (custom headers, bearer token) by subscription id, read
    at each attempt so a rotated token applies to pending retries too.
    """

    def __init__(
        self,
        outbox: Outbox,
        *,
        timeout_s: float = 5.0,
        backoff: Backoff = Backoff(),
        max_age_s: float = 24 * 3600.0,
        concurrency: int = 4,
        poll_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
        on_attempt: Callable[[Delivery, AttemptResult], None] | None = None,
        headers_for: Callable[[str], dict[str, str]] | None = None,
        address_policy: AddressPolicy | None = None,
    ) -> None:
        self.outbox = outbox
        self.address_policy = address_policy
        self.timeout_s = timeout_s
        self.backoff = backoff
        self.max_age_s = max_age_s
        self.concurrency = concurrency
        self.poll_interval_s = poll_interval_s
        # How long a claimed row is this worker's (clock seconds): longer than an attempt takes;
        # if the worker dies mid-attempt, another takes the row over after it.
        self.claim_hold_s = 2 * timeout_s + 5.0
        self._clock = clock
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        self._on_attempt = on_attempt
        self._headers_for = headers_for
        self._client = httpx.Client(timeout=timeout_s, transport=transport, follow_redirects=False,
                                    headers={"user-agent": USER_AGENT})
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._inflight: dict[str, str] = {}      # webhook id -> its subscription, attempt in flight
        self._inflight_lock = threading.Lock()
        # Held from a claim to its rows being in flight: between the two a claimed row is
        # neither due nor in flight, and drain() would take the worker for idle.
        self._claim_lock = threading.Lock()
        # Attempts made and not recorded yet (each still in flight): the next pass records them.
        self._finished: list[tuple[Delivery, AttemptResult, float]] = []
        # Rows claimed for this worker in the job that enqueued them (``reserve``): webhook id ->
        # when the claim runs out; handed over (``take``) once that job is durable.
        self._reserved: dict[str, float] = {}
        self._handed: list[str] = []
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return (f"DeliveryWorker(timeout_s={self.timeout_s}, backoff={self.backoff}, "
                f"max_age_s={self.max_age_s}, concurrency={self.concurrency})")

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> "DeliveryWorker":
        if self._thread is not None:
            raise RuntimeError("DeliveryWorker already started; create a new one after stop()")
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="webhook-send")
        self._thread = threading.Thread(target=self._loop, name="webhook-delivery", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop claiming rows, let in-flight attempts finish (bounded by the HTTP timeout)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        with self._inflight_lock:
            finished, self._finished = self._finished, []
        if finished:   # the attempts that ended while stopping: recorded in one last job
            try:
                self.outbox.record_and_claim([self._outcome(d, r, at) for d, r, at in finished], self._clock(),
                                             limit=0, hold_s=0.0, busy=lambda: (set(), set()), claimed=lambda ds: None)
            except Exception:  # the store is gone: the rows stay pending (at least once)
                log.exception("webhook delivery: %d attempts made while stopping were not recorded", len(finished))
        self._client.close()

    def wake(self) -> None:
        """New rows were enqueued: look now rather than at the next poll."""
        self._wake.set()

    @property
    def inflight(self) -> int:
        with self._inflight_lock:
            return len(self._inflight)

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until no delivery is due at the clock's time now and none is in flight (each
        attempt recorded); False if that took longer than ``timeout_s``. Retries scheduled for
        later are not waited for: they fall due when the clock gets there."""
        deadline = time.monotonic() + timeout_s
        self.wake()
        while time.monotonic() < deadline:
            # A row the loop has claimed is in flight until its attempt is recorded; one it has
            # not claimed yet is still due: either way not idle.
            with self._claim_lock:
                if self.inflight == 0 and not self.outbox.due(self._clock(), limit=1):
                    return True
            if self._stopping.is_set():
                return False
            time.sleep(0.002)  # a barrier's poll: an attempt is an HTTP round trip in a pool thread
        return False

    # -- work ---------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Send every due row synchronously in this thread (for tests and tools); returns count."""
        sent = 0
        for d in self.outbox.due(self._clock(), limit=1000):
            a = self._outcome(d, self._attempt(d), self._clock())
            self.outbox.record_attempt(a.webhook_id, self._clock(), state=a.state, status=a.status, error=a.error,
                                       next_attempt_at=a.next_attempt_at, pull_forward=a.pull_forward)
            sent += 1
        return sent

    # -- hand-off: a page claimed in the job that enqueued it ---------------------------------

    def reserve(self, subscription_id: str, webhook_id: str) -> float | None:
        """While a change enqueues a delivery (before its job): if a sender is free and the
        subscription has no attempt in flight, the row is this worker's from that job on
        (claimed in it for the returned seconds: the attempt starts as soon as the job is
        durable, :meth:`take`); else None, and the worker claims it itself. A reservation whose
        job never committed lapses with its claim."""
        now = self._clock()
        with self._inflight_lock:
            self._expire(now)
            if (self._pool is None or self._stopping.is_set() or len(self._inflight) >= self.concurrency
                    or subscription_id in self._inflight.values()):
                return None
            hold = self.timeout_s + HAND_OFF_MARGIN_S
            self._inflight[webhook_id] = subscription_id
            self._reserved[webhook_id] = now + hold
        return hold

    def take(self, webhook_id: str) -> None:
        """The job that reserved ``webhook_id`` is durable: send it now (called after its commit)."""
        with self._inflight_lock:
            if webhook_id not in self._reserved:
                return   # lapsed: the row is claimed again once its claim runs out
            self._handed.append(webhook_id)
        self._wake.set()

    def release(self, webhook_id: str) -> None:
        """The job that reserved ``webhook_id`` failed (the row was never written): the sender
        and the subscription are free again at once, not when the claim would have run out."""
        with self._inflight_lock:
            if self._reserved.pop(webhook_id, None) is not None:
                self._inflight.pop(webhook_id, None)

    def _expire(self, now: float) -> None:
        """Forget reservations whose claim ran out (their job failed, or the hand-off came late)."""
        for wid in [w for w, until in self._reserved.items() if until <= now]:
            del self._reserved[wid]
            self._inflight.pop(wid, None)

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                wait_s = self._claim_and_send()
            except Exception:  # the store is down (a database restart): deliveries wait, the worker stays
                log.exception("webhook delivery could not read the outbox; trying again in %.1f s",
                              self.poll_interval_s)
                wait_s = self.poll_interval_s
            self._wake.wait(wait_s)

    def _claim_and_send(self) -> float:
        """One pass: send what was handed over, then ONE writer job that records the attempts
        finished since the last pass (pulling their subscriptions' waiting rows forward) and
        claims what is due for the free senders; returns how long to wait before looking again."""
        assert self._pool is not None
        now = self._clock()
        # Held from a claim to its rows being in flight: between the two a claimed row is
        # neither due nor in flight, and drain() would take the worker for idle.
        with self._claim_lock:
            with self._inflight_lock:
                self._expire(now)
                handed = [(w, self._reserved.pop(w)) for w in self._handed if w in self._reserved]
                self._handed.clear()
                finished, self._finished = self._finished, []
            for wid, until in handed:
                d = self.outbox.get(wid)   # a read: the row was claimed in the job that wrote it
                if d is None or d.state != "pending" or now + self.timeout_s > until:
                    with self._inflight_lock:   # its claim would run out mid-attempt: claimed again later
                        self._inflight.pop(wid, None)
                    continue
                self._pool.submit(self._attempt_and_release, d)
            recording = {d.webhook_id for d, _, _ in finished}
            with self._inflight_lock:
                busy = {w: s for w, s in self._inflight.items() if w not in recording}
            free = self.concurrency - len(busy)
            if not finished and not (free > 0 and self.outbox.due(
                    now, limit=1, exclude=set(busy), skip_subscriptions=set(busy.values()))):
                # (A read first: no write per idle poll.)
                return self._sleep_s()
            taken: list[Delivery] = []

            def busy_now() -> tuple[set[str], set[str]]:   # in the job: a reservation made before it counts
                with self._inflight_lock:
                    now_busy = {w: s for w, s in self._inflight.items() if w not in recording}
                return set(now_busy), set(now_busy.values())

            def hold(claimed: list[Delivery]) -> None:
                taken.extend(claimed)
                with self._inflight_lock:
                    self._inflight.update((d.webhook_id, d.subscription_id) for d in claimed)
            try:
                due = self.outbox.record_and_claim(
                    [self._outcome(d, r, at) for d, r, at in finished], now, limit=max(free, 0),
                    hold_s=self.claim_hold_s, busy=busy_now, claimed=hold)
            except BaseException:
                with self._inflight_lock:   # nothing of the job is durable: record them next time
                    self._finished[:0] = finished
                    for d in taken:
                        self._inflight.pop(d.webhook_id, None)
                raise
            with self._inflight_lock:
                for wid in recording:
                    self._inflight.pop(wid, None)
            for d in due:
                self._pool.submit(self._attempt_and_release, d)
            if not due and self.inflight:
                # What is due waits for its subscription's attempt in flight, whose end wakes us.
                return self.poll_interval_s
        return self._sleep_s()

    def _sleep_s(self) -> float:
        if self.inflight >= self.concurrency:
            return self.poll_interval_s  # a finishing attempt wakes us
        nxt = self.outbox.next_due_at()
        if nxt is None:
            return self.poll_interval_s
        return min(self.poll_interval_s, max(0.0, nxt - self._clock()))

    def _attempt_and_release(self, d: Delivery) -> None:
        try:
            result = self._attempt(d)
        except Exception:  # never let one row kill the sender thread; the row stays pending
            log.exception("webhook attempt %s crashed", d.webhook_id)
            with self._inflight_lock:
                self._inflight.pop(d.webhook_id, None)
        else:
            with self._inflight_lock:   # in flight until the next pass records it
                self._finished.append((d, result, self._clock()))
        self._wake.set()

    def _attempt(self, d: Delivery) -> AttemptResult:
        """Send one delivery (nothing is written: the loop's next pass records the result)."""
        refused = self.address_policy.refusal(d.url, unresolvable_ok=True) if self.address_policy else None
        if refused:  # checked again at delivery: DNS may have changed since the subscription
            result = AttemptResult(False, False, None, refused)
            if self._on_attempt is not None:
                self._on_attempt(d, result)
            return result
        headers = self._headers_for(d.subscription_id) if self._headers_for is not None else {}
        # The signature's timestamp is checked against the receiver's own clock: wall time.
        wall = getattr(self._clock, "wall", self._clock)()
        headers.update(sign_headers(d.secret, d.webhook_id, int(wall), d.body))
        headers["content-type"] = d.content_type
        try:
            response = self._client.post(d.url, content=d.body, headers=headers)
            result = classify(response, wall)  # Retry-After dates are wall times too
        except httpx.UnsupportedProtocol as exc:
            result = AttemptResult(False, False, None, f"{type(exc).__name__}: {exc}")
        except httpx.TimeoutException as exc:
            result = AttemptResult(False, True, None, f"timeout after {self.timeout_s}s: {type(exc).__name__}")
        except httpx.TransportError as exc:
            result = AttemptResult(False, True, None, f"{type(exc).__name__}: {exc}")
        if self._on_attempt is not None:
            self._on_attempt(d, result)
        return result

    def _outcome(self, d: Delivery, r: AttemptResult, now: float) -> Attempt:
        """What to record of an attempt made at ``now``."""
        if r.delivered:
            # The receiver is back: what waits for it in backoff goes now, not minutes later
            # (made due in the same writer job that records this delivery).
            return Attempt(d.webhook_id, "delivered", r.status, None, pull_forward=d.subscription_id)
        if not r.retryable:
            log.warning("webhook %s to %s failed for good: %s", d.webhook_id, d.url, r.error)
            return Attempt(d.webhook_id, "failed", r.status, r.error)
        deadline = d.created_at + self.max_age_s
        if now >= deadline:
            log.error("webhook %s to %s is dead after %d attempts: %s", d.webhook_id, d.url,
                      d.attempts + 1, r.error)
            return Attempt(d.webhook_id, "dead", r.status, r.error)
        if r.retry_after_s is not None:
            delay = r.retry_after_s
        else:
            with self._rng_lock:
                delay = self.backoff.delay_s(d.attempts + 1, self._rng)
        return Attempt(d.webhook_id, "pending", r.status, r.error, next_attempt_at=min(now + delay, deadline))
