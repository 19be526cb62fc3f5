"""Which detectors watch a run, built from its config and :mod:`healthsvc_detectors.registry`.

A run's config may carry ``detectors: {name: {param: value, ...}}`` (``{"enabled": false}``
switches one off). The registry says each detector's role; the suite keeps the block detectors
(``arrival``: every accepted batch; ``aligned``: per-step frames from the aligner) apart from the
absence detectors (arrivals, heartbeats and the ticker's clock), each typed by its protocol.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from healthsvc_detectors.base import AbsenceDetector, BlockDetector
from healthsvc_detectors.registry import REGISTRY
from healthsvc.detector_config import validate_params
from healthsvc.errors import InvalidInput
from healthsvc.schemas import upgrade_stored_config


@dataclass
class DetectorSuite:
    arrival: dict[str, BlockDetector]
    aligned: dict[str, BlockDetector]
    absence: dict[str, AbsenceDetector]

    def all(self) -> dict[str, Union[BlockDetector, AbsenceDetector]]:
        return {**self.arrival, **self.aligned, **self.absence}

    def reset(self) -> None:
        for det in self.all().values():
            det.reset()


def build_suite(config: dict[str, Any]) -> DetectorSuite:
    """Detectors for a run config; raises InvalidInput naming a bad detector parameter."""
    config = upgrade_stored_config(config)
    if not isinstance(config.get("detectors") or {}, dict):
        raise InvalidInput("detectors must be an object", loc=("body", "detectors"))
    params: dict[str, dict[str, Any]] = dict(config.get("detectors") or {})
    unknown = [n for n in params if n not in REGISTRY]
    if unknown:
        raise InvalidInput(f"unknown detector {unknown[0]!r}; known: {', '.join(REGISTRY)}",
                           loc=("body", "detectors", unknown[0]))
    suite = DetectorSuite({}, {}, {})
    for name, entry in REGISTRY.items():
        raw = params.get(name, {})
        if isinstance(raw, dict) and raw.get("enabled", True) is False:
            continue
        # Types and ranges from the constructor (healthsvc.detector_config): a 422 naming the field.
        kwargs = validate_params(name, entry.cls, raw, loc=("body", "detectors", name))
        try:
            det = entry.cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"bad parameters for detector {name!r}: {exc}",
                               loc=("body", "detectors", name)) from None
        getattr(suite, entry.role)[name] = det
    share_peer_deviations(list(suite.aligned.values()))
    return suite


def share_peer_deviations(detectors: list[BlockDetector]) -> None:
    """Detectors that compare each rank with its peers by the rank's own history (the spike
    detectors' per-rank view, ``rank_outlier``) watch the same metric through one tracker when
    their tracker settings agree: it learns once per block and each reads the same view, so the
    per-rank work is paid once. A tracker set up differently stays private."""
    groups: dict[tuple, list[BlockDetector]] = {}
    for det in detectors:
        for metric, tracker in det.peer_deviations().items():
            groups.setdefault((metric, tracker.params()), []).append(det)
    for (metric, _), users in groups.items():
        if len(users) > 1:
            tracker = users[0].peer_deviations()[metric]
            tracker.shared = True
            for det in users[1:]:
                det.use_peer_deviation(metric, tracker)
