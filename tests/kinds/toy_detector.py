"""A toy detector and its kind, declared the way a new detector module declares them: the class
with its ``kinds``, and one registry entry. Nothing else in the project names ``toy``."""
from __future__ import annotations

from typing import Any

import numpy as np

from healthsvc_detectors.base import BlockDetector, Detector
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.registry import Registered


class ToyDetector(Detector, BlockDetector):
    """``toy``: a rank whose loss reaches ``threshold`` (critical, once per rank)."""

    kind = "toy"
    kinds = (Kind("toy", "a rank's loss reached the toy threshold", resolves="latched", mutes=frozenset(),
                  corruption="abrupt", heals=False, onset_guessed=False, probe=False, incident="corruption",
                  restarts_at="critical", blames_host=False, label="toy", colour="#123456"),)

    def __init__(self, threshold: float = 1_000.0) -> None:
        self.threshold = threshold
        super().__init__()

    def _reset(self) -> None:
        self._fired: set[int] = set()

    def update(self, block: StepBlock) -> list[Finding]:
        if "loss" not in block.values:
            return []
        hit = block.present["loss"] & (block.values["loss"] >= self.threshold)
        out = []
        for i, j in zip(*np.nonzero(hit)):
            rank = int(block.ranks[j])
            if rank not in self._fired:
                self._fired.add(rank)
                out.append(Finding("toy", step=int(block.steps[i]), ranks=(rank,), severity="critical",
                                   score=1.0, metric="loss", evidence={"threshold": self.threshold}))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"fired": sorted(self._fired)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._fired = set(int(r) for r in state["fired"])


ENTRY = Registered("toy", ToyDetector, "aligned")
