"""A finding's identity, in one place: what findings, alerts and run health agree a finding *is*.

Two levels, both derived from the same fields of :class:`~detectors.finding.Finding`:

- the **condition** a finding reports: its run, kind, metric and blamed ranks. As labels
  (:func:`condition_labels`, the alert's identity labels) ``rank`` is the blamed rank when a
  finding blames exactly one, ``"*"`` when it blames several or none (a NaN on 512 ranks is one
  condition). Its :func:`fingerprint` (16 hex digits of SHA-256 over the sorted labels) is the
  alert's fingerprint; :func:`finding_fingerprint` gives it for a finding, so run health can tell
  which alert a stored finding belongs to.
- the **occurrence**: the condition at one step, firing or resolved, in one attempt
  (:func:`occurrence_key`, from ``Finding.identity``). It is unique per run in the store, so a
  replay after a restart never stores or announces a finding twice.

>>> from detectors.finding import Finding
>>> f = Finding("loss_spike", step=120, metric="loss", ranks=(3,))
>>> condition_labels(f, "r1")
{'alertname': 'loss_spike', 'run': 'r1', 'rank': '3', 'metric': 'loss'}
>>> occurrence_key(2, f)
'2|loss_spike|loss|3|120|firing'
"""
from __future__ import annotations

import hashlib
from typing import Mapping

from detectors.finding import Finding

ALL_RANKS = "*"
IDENTITY_LABELS: tuple[str, ...] = ("alertname", "run", "rank", "metric")


def condition_labels(finding: Finding, run_id: str) -> dict[str, str]:
    """Identity labels of the condition (and alert) a finding belongs to."""
    labels = {
        "alertname": finding.kind,
        "run": run_id,
        "rank": str(finding.ranks[0]) if len(finding.ranks) == 1 else ALL_RANKS,
    }
    if finding.metric:
        labels["metric"] = finding.metric
    return labels


def fingerprint(labels: Mapping[str, str]) -> str:
    """Stable id of a label set: 16 hex digits of SHA-256 over ``name=value`` lines, sorted.

    >>> fingerprint({"run": "r", "alertname": "stall"}) == fingerprint({"alertname": "stall", "run": "r"})
    True
    """
    text = "\n".join(f"{k}={labels[k]}" for k in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def finding_fingerprint(run_id: str, finding: Finding) -> str:
    """The fingerprint of the alert a finding belongs to."""
    return fingerprint(condition_labels(finding, run_id))


def occurrence_key(attempt: int, finding: Finding) -> str:
    """The stored identity of one finding (unique per run): attempt, kind, metric, ranks, step,
    status, as ``|``-separated text (the format stored findings already carry)."""
    kind, metric, ranks, step, status = finding.identity
    return f"{attempt}|{kind}|{metric}|{','.join(map(str, ranks))}|{step}|{status}"
