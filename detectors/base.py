"""The protocol every streaming detector follows (after river's drift-detector protocol).

- Constructor arguments are hyper-parameters, stored under the same names.
- Learned state is private and created in one ``_reset()``; ``reset()`` calls it.
- ``update(block)`` consumes the next block of steps x ranks and returns the *new* findings.
  Feeding the same steps split into blocks anywhere yields the same findings.
- Absence-based detectors also implement ``tick(now)``; time always comes from the caller.
- ``state_dict()`` returns a JSON-serialisable dict (numpy arrays as lists) of the learned
  state; ``load_state_dict()`` restores it so a restarted service neither re-warms nor repeats
  findings.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from detectors.finding import Finding
from detectors.frame import StepBlock


class Detector(ABC):
    kind: str = ""

    def __init__(self) -> None:
        self._reset()

    @abstractmethod
    def _reset(self) -> None: ...

    def reset(self) -> None:
        self._reset()

    @abstractmethod
    def update(self, block: StepBlock) -> list[Finding]: ...

    def tick(self, now: float) -> list[Finding]:
        return []

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({params})"

    def params(self) -> dict[str, Any]:
        """Hyper-parameters: the public attributes named like the constructor's arguments."""
        import inspect
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {n: getattr(self, n) for n in names if hasattr(self, n)}
