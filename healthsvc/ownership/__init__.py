"""Who watches a run: the one replica that runs its detectors, its ticker and its alert lifecycle.

Any replica accepts any push (ingest is stateless beyond the store), but a run's detector state
lives in one process's memory, so exactly one replica at a time may feed it, tick it, snapshot it
and turn its findings into alerts. The monitor hub asks a :class:`RunOwnership` before each of
those:

- :meth:`~RunOwnership.claim` on a run's activity: ``True`` if this replica owns the run (it may
  have just taken it); ``False`` if another replica does, and then the hub hands the push on with
  :meth:`~RunOwnership.announce` so the owner pulls it from the store.
- :meth:`~RunOwnership.owns`: the cheap, local question the ticker and alerting ask.
- ``on_lost(run_id)`` / ``on_gained(run_id)`` (given to :meth:`~RunOwnership.start`): the lease
  ran out or was taken (drop the run's in-memory state, write nothing more for it), or this
  replica took an abandoned run over (restore it from its snapshot and the chunks after it).
- ``on_remote(run_id, message)``: a push to the run was accepted by another replica.
- :meth:`~RunOwnership.release`: the hub let go of a finished, quiet run; nobody holds it until
  its next activity claims it.

What one process and replicas do differently is this protocol's too, so no module above it asks
which it is running under. Each method is named for what it decides:

- :meth:`~RunOwnership.restores`: whether a run claimed with no state in memory is restored from
  the store (its snapshot and the chunks after it) or started empty;
- :meth:`~RunOwnership.restore`: the steps of a restore, in order (:class:`Restore`): the path a
  start-up and a takeover both take;
- :meth:`~RunOwnership.catch_up`: on each tick, read what a lost notification did not bring;
- :meth:`~RunOwnership.fed_chunks`: how the chunks fed to a run's monitor are told
  (:mod:`healthsvc.ownership.fed_chunks`);
- :meth:`~RunOwnership.let_go`: what letting go of a finished run's monitor gives up (a lease,
  and with it alerting's copy of the run);
- :meth:`~RunOwnership.readiness`: what ``/readyz`` says of it (a replica's id and leases);
- :meth:`~RunOwnership.holds_every_run`: whether this process holds every run from start-up to
  shutdown, so alerting may keep every run's alerts at once, or runs
  come and go, and alerting keeps those it owns and reads again what other replicas change.

Two implementations:

- :class:`SoleOwner` (the SQLite store, one process): owns every run, hears of no other
  replica; every call is a constant, so a single server pays nothing for the protocol.
- :class:`healthsvc.ownership.leases.PgLeases` (PostgreSQL): a lease row per run with a fencing token,
  renewed by a background thread; pushes handed on with ``NOTIFY``.

>>> own = SoleOwner()
>>> own.claim("r1"), own.owns("r1"), own.held()
(True, True, {})
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from healthsvc.ownership.fed_chunks import FedChunks, InOrder
from healthsvc.store.fencing import Fence
from healthsvc.store.open import is_postgres_uri


# A push accepted by another replica, as the owner hears of it (see PgLeases.announce):
# {"chunks": [ids]} for metrics, {"event": kind, "data": {...}, "at": received_at} for the rest.
RemoteMessage = dict[str, Any]


class Restore(Protocol):
    """The steps of restoring a run's monitor (the monitor hub's), run in the order its
    ownership says (:meth:`RunOwnership.restore`)."""

    def hand_over(self) -> None:
        """Tell the run's other holders in this process (alerting) that it is owned here now,
        before any finding of the restore is recorded."""
        ...

    def replay(self) -> None:
        """Feed the chunks stored after the run's snapshot."""
        ...

    def heartbeats(self) -> None:
        """Feed each rank's newest stored heartbeat that is newer than the snapshot."""
        ...

    def finish(self) -> None:
        """Record the run's finish, if it finished."""
        ...

    def skip_downtime(self) -> None:
        """Shift the absence checks' clock past the time since the run's last input."""
        ...


class RunOwnership(Protocol):
    replica_id: str

    def start(self, *, on_gained: Callable[[str], None], on_lost: Callable[[str], None],
              on_remote: Callable[[str, RemoteMessage], None]) -> None: ...
    def stop(self) -> None: ...
    def claim(self, run_id: str) -> bool: ...
    def owns(self, run_id: str) -> bool: ...
    def fence(self, run_id: str) -> Fence | None: ...
    def announce(self, run_id: str, message: RemoteMessage) -> None: ...
    def release(self, run_id: str) -> None: ...
    def tell_owner(self, run_id: str, message: RemoteMessage) -> None: ...
    def held(self) -> dict[str, int]: ...

    def restores(self, run_id: str, let_go_here: Callable[[], bool]) -> bool:
        """A run claimed here has no monitor: restore it from the store rather than start it
        empty? ``let_go_here()``: this process let the run go before (it has a snapshot)."""
        ...

    def restore(self, run_id: str, steps: Restore) -> None:
        """Run the steps of the run's restore, in order."""
        ...

    def catch_up(self, run_id: str, pull: Callable[[str], None]) -> None:
        """On a tick, for an owned run: ``pull(run_id)`` feeds the chunks after its watermark."""
        ...

    def fed_chunks(self) -> FedChunks:
        """The bookkeeping of the chunks fed to this process's monitors."""
        ...

    def let_go(self, run_id: str, give_up: Callable[[str], None]) -> None:
        """The hub let go of a finished run's monitor: ``give_up(run_id)`` parks the run until
        nothing needs it here, then releases it (alerting forgets it, the lease goes)."""
        ...

    def holds_every_run(self) -> bool:
        """Whether this process owns every run from start-up to shutdown."""
        ...

    def readiness(self) -> dict[str, Any]:
        """What ``/readyz`` says of this process's ownership (nothing for the sole owner)."""
        ...


class SoleOwner:
    """The only replica: owns every run from the start; nothing to renew, announce or hear."""

    replica_id = "sole"

    def start(self, *, on_gained: Callable[[str], None], on_lost: Callable[[str], None],
              on_remote: Callable[[str, RemoteMessage], None]) -> None:
        pass

    def stop(self) -> None:
        pass

    def claim(self, run_id: str) -> bool:
        return True

    def owns(self, run_id: str) -> bool:
        return True

    def fence(self, run_id: str) -> Fence | None:
        return None

    def announce(self, run_id: str, message: RemoteMessage) -> None:
        raise AssertionError("the sole owner never hands a push on")  # claim() is always True

    def release(self, run_id: str) -> None:
        pass  # no lease: the run is this process's whenever it is active again

    def tell_owner(self, run_id: str, message: RemoteMessage) -> None:
        pass  # this process is the owner

    def held(self) -> dict[str, int]:
        """Leases held, run id -> fencing token: none (this replica owns everything, no lease)."""
        return {}

    def restores(self, run_id: str, let_go_here: Callable[[], bool]) -> bool:
        # Every run was restored at start-up: one without a monitor is new, unless this
        # process let it go since (it finished; its next input brings it back).
        return let_go_here()

    def restore(self, run_id: str, steps: Restore) -> None:
        # Nobody heard the ranks while this process was down (or had let the run go): the time
        # since the run's last input is not the ranks' silence.
        steps.replay()
        steps.finish()
        steps.skip_downtime()

    def catch_up(self, run_id: str, pull: Callable[[str], None]) -> None:
        pass   # every push of the run was accepted here, and reached the monitor in the pipeline

    def fed_chunks(self) -> FedChunks:
        return InOrder()

    def let_go(self, run_id: str, give_up: Callable[[str], None]) -> None:
        pass   # no lease: the run stays this process's, and its alerts with it

    def holds_every_run(self) -> bool:
        return True

    def readiness(self) -> dict[str, Any]:
        return {}


def ownership_for(settings: Any, store: Any) -> RunOwnership:
    """Leases in PostgreSQL for a ``postgresql://`` store (replicas), else the sole owner."""
    uri = str(getattr(store, "uri", ""))
    if not is_postgres_uri(uri):
        return SoleOwner()
    from healthsvc.ownership.leases import PgLeases
    return PgLeases(uri, ttl_s=settings.lease_ttl_s, replica_id=settings.replica_id or None,
                    port=int(getattr(settings, "port", 0) or 0))


class LeasesCollector:
    """Prometheus, at scrape time: the leases this replica holds (one series per run, valued by
    its fencing token, so a takeover shows as a new value on another replica) and the
    ownership's counters (takeovers, notifications sent and heard), where it keeps them."""

    def __init__(self, ownership: RunOwnership) -> None:
        self.ownership = ownership

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        held = self.ownership.held()
        count = GaugeMetricFamily("healthsvc_leases_held", "Run leases this replica holds.", labels=["replica"])
        count.add_metric([self.ownership.replica_id], len(held))
        lease = GaugeMetricFamily("healthsvc_lease_token", "Fencing token of each run lease this replica holds.",
                                  labels=["replica", "run"])
        for run_id, token in sorted(held.items()):
            lease.add_metric([self.ownership.replica_id, run_id], token)
        yield count
        yield lease
        for name, doc in (("takeovers", "Runs this replica took over from an expired lease."),
                          ("notifications_sent", "Pushes accepted here handed on to a run's owner (NOTIFY)."),
                          ("notifications_heard", "Notifications of pushes accepted by other replicas.")):
            if hasattr(self.ownership, name):
                c = CounterMetricFamily(f"healthsvc_lease_{name}", doc, labels=["replica"])
                c.add_metric([self.ownership.replica_id], getattr(self.ownership, name))
                yield c
