"""Which detectors watch a run, built from its config.

A run's config may carry ``detectors: {name: {param: value, ...}}`` (``{"enabled": false}``
switches one off) and ``hang_timeout_floor_s``. Detectors come in three roles:

- ``arrival``: judged on every accepted batch, without waiting for other ranks (non-finite values:
  a NaN must page at once);
- ``aligned``: fed per-step frames from the aligner (spikes, stragglers, slowdowns, outliers,
  divergence);
- ``absence``: the hang/stall detector, fed arrivals, heartbeats and the ticker's clock.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from detectors.base import Detector
from healthsvc.detector_config import validate_params
from healthsvc.errors import InvalidInput

# name -> (module, class, role, fixed kwargs). Names are the finding kinds they report (the hang
# detector reports both "hang" and "stall"; configure it under "hang").
REGISTRY: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "non_finite": ("detectors.non_finite", "NonFiniteDetector", "arrival", {}),
    "loss_spike": ("detectors.spike", "LossSpikeDetector", "aligned", {}),
    "grad_spike": ("detectors.spike", "GradSpikeDetector", "aligned", {}),
    "straggler": ("detectors.straggler", "StragglerDetector", "aligned", {}),
    "slowdown": ("detectors.slowdown", "SlowdownDetector", "aligned", {}),
    "rank_outlier": ("detectors.rank_outlier", "RankOutlierDetector", "aligned", {}),
    "divergence": ("detectors.divergence", "DivergenceDetector", "aligned", {}),
    "replica_mismatch": ("detectors.replica", "ReplicaMismatchDetector", "aligned", {}),
    "resume_mismatch": ("detectors.resume", "ResumeMismatchDetector", "aligned", {}),
    "hang": ("detectors.hang", "HangDetector", "absence", {}),
}


def _detector_class(name: str) -> type[Detector] | None:
    module, cls, _, _ = REGISTRY[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except (ModuleNotFoundError, AttributeError):
        return None  # not part of this build


@dataclass
class DetectorSuite:
    arrival: dict[str, Detector]
    aligned: dict[str, Detector]
    absence: dict[str, Detector]

    def all(self) -> dict[str, Detector]:
        return {**self.arrival, **self.aligned, **self.absence}

    def reset(self) -> None:
        for det in self.all().values():
            det.reset()


def build_suite(config: dict[str, Any]) -> DetectorSuite:
    """Detectors for a run config; raises InvalidInput naming a bad detector parameter."""
    if not isinstance(config.get("detectors") or {}, dict):
        raise InvalidInput("detectors must be an object", loc=("body", "detectors"))
    params: dict[str, dict[str, Any]] = dict(config.get("detectors") or {})
    unknown = [n for n in params if n not in REGISTRY]
    if unknown:
        raise InvalidInput(f"unknown detector {unknown[0]!r}; known: {', '.join(REGISTRY)}",
                           loc=("body", "detectors", unknown[0]))
    if config.get("hang_timeout_floor_s"):
        params["hang"] = {"timeout_floor_s": float(config["hang_timeout_floor_s"]), **params.get("hang", {})}
    suite = DetectorSuite({}, {}, {})
    for name, (_, _, role, fixed) in REGISTRY.items():
        raw = params.get(name, {})
        if isinstance(raw, dict) and raw.get("enabled", True) is False:
            continue
        cls = _detector_class(name)
        if cls is None:
            continue
        # Types and ranges from the constructor (healthsvc.detector_config): a 422 naming the field.
        kwargs = validate_params(name, cls, raw, loc=("body", "detectors", name))
        try:
            det = cls(**fixed, **kwargs)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"bad parameters for detector {name!r}: {exc}",
                               loc=("body", "detectors", name)) from None
        getattr(suite, role)[name] = det
    share_peer_deviations(list(suite.aligned.values()))
    return suite


def share_peer_deviations(detectors: list[Detector]) -> None:
    """Detectors that compare each rank with its peers by the rank's own history (the spike
    detectors' per-rank view, ``rank_outlier``) watch the same metric through one tracker when
    their tracker settings agree: it learns once per block and each reads the same view, so the
    per-rank work is paid once. A tracker set up differently stays private."""
    groups: dict[tuple, list[Detector]] = {}
    for det in detectors:
        for metric, tracker in getattr(det, "peer_deviations", dict)().items():
            groups.setdefault((metric, tracker.params()), []).append(det)
    for (metric, _), users in groups.items():
        if len(users) > 1:
            tracker = users[0].peer_deviations()[metric]
            tracker.shared = True
            for det in users[1:]:
                det.use_peer_deviation(metric, tracker)
