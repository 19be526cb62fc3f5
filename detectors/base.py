"""The two shapes of streaming detector, and what they share (after river's drift-detector protocol).

What every detector shares (:class:`Detector`):

- Constructor arguments are hyper-parameters, stored under the same names (:meth:`Detector.params`,
  which ``repr`` shows); :meth:`Detector.clone` is a fresh detector with the same ones.
- Learned state is private and created in one ``_reset()``; ``reset()`` calls it.
- ``state_dict()`` returns a JSON-serialisable dict (numpy arrays as lists) of the learned
  state; ``load_state_dict()`` restores it so a restarted service neither re-warms nor repeats
  findings.
- Time always comes from the caller; a detector never reads a clock.

The two shapes, as typed protocols the service calls them through:

- :class:`BlockDetector` judges *values*: ``update(block)`` consumes the next block of
  steps x ranks and returns the *new* findings. Feeding the same steps split into blocks anywhere
  yields the same findings.
- :class:`AbsenceDetector` judges *silence*: blocks carry no arrival time, so it is told of
  arrivals (``observe``), heartbeats, the expected world and the end of the run, each with the
  caller's clock, and ``tick(now)`` returns what that clock makes overdue.

A detector class derives from :class:`Detector` and from the protocol of its shape, e.g.
``class SpikeDetector(Detector, BlockDetector)``; the protocol's methods are abstract there, so a
class that forgets one cannot be built. Which shape a registered detector has is said by
:mod:`healthsvc_detectors.registry`.
"""
from __future__ import annotations

import copy
import inspect
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Protocol, TypeVar, runtime_checkable

import numpy as np

from healthsvc_detectors.finding import Finding
from healthsvc_detectors.kinds import Kind

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc_detectors.peers import PeerDeviation
from healthsvc_detectors.frame import StepBlock

D = TypeVar("D", bound="Detector")


class Detector(ABC):
    """Hyper-parameters, learned state, reset, repr and clone: what both shapes share."""

    kind: str = ""
    # What each kind this detector reports means (healthsvc_detectors.kinds): declared here, on the class,
    # so the registry entry carries it and no consumer keeps a list of its own.
    kinds: ClassVar[tuple[Kind, ...]] = ()

    def __init__(self) -> None:
        self._reset()

    @abstractmethod
    def _reset(self) -> None: ...

    def reset(self) -> None:
        self._reset()

    def new_attempt(self) -> None:
        """The run restarted from a checkpoint (a new attempt). By default a detector starts again
        from the resumed step; one that judges the resume itself (``resume_mismatch``) keeps what
        the abandoned attempt reported."""
        self.reset()

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({params})"

    def params(self) -> dict[str, Any]:
        """Hyper-parameters: the public attributes named like the constructor's arguments."""
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {n: getattr(self, n) for n in names if hasattr(self, n)}

    def clone(self: D) -> D:
        """A fresh detector with the same hyper-parameters and no learned state, sharing nothing
        with this one (not even a per-rank tracker the suite made it share)."""
        twin = copy.deepcopy(self)
        twin.reset()
        return twin


@runtime_checkable
class BlockDetector(Protocol):
    """Judges the values of blocks of steps x ranks (NaN is a value; a cell not present is not)."""

    kind: str

    @abstractmethod
    def update(self, block: StepBlock) -> list[Finding]:
        """The new findings the next block causes (blocks arrive in step order)."""

    def reset(self) -> None: ...
    def new_attempt(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def peer_deviations(self) -> "dict[str, PeerDeviation]":
        """The per-rank trackers by metric that the suite may share between detectors watching
        the same metric the same way (:func:`healthsvc.monitor.suite.share_peer_deviations`);
        none by default."""
        return {}

    def use_peer_deviation(self, metric: str, tracker: "PeerDeviation") -> None:
        """Watch ``metric`` through ``tracker`` (shared with another detector) from now on."""
        return None


@runtime_checkable
class AbsenceDetector(Protocol):
    """Judges silence on the caller's clock (seconds): arrivals, heartbeats, the world, ticks.

    The input methods return the *resolved* findings they cause (a rank that speaks again);
    :meth:`tick` returns the new *firing* ones.
    """

    kind: str

    @abstractmethod
    def observe(self, ranks: np.ndarray, steps: np.ndarray, now: float) -> list[Finding]:
        """Per-rank step records arrived at ``now``; ranks may repeat (many steps)."""

    @abstractmethod
    def heartbeat(self, rank: int, step: int, phase: str, now: float) -> list[Finding]:
        """A heartbeat of ``rank`` at ``step`` (negative: unknown) in ``phase`` arrived."""

    @abstractmethod
    def set_world(self, ranks: Iterable[int], now: float) -> list[Finding]:
        """The ranks expected from now on; ranks left out are no longer expected."""

    @abstractmethod
    def tick(self, now: float) -> list[Finding]:
        """The new findings that the time ``now`` makes due."""

    @abstractmethod
    def finish(self, now: float) -> list[Finding]:
        """The run finished: silence is normal from now on."""

    @abstractmethod
    def shift_clock(self, shift_s: float) -> None:
        """Move every remembered time forward (time the caller was not watching is no silence)."""

    def reset(self) -> None: ...
    def new_attempt(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
