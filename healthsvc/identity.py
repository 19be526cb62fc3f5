"""A finding's identity, in one place: what findings, alerts and run health agree a finding *is*.

Two levels, both derived from the same fields of :class:`~healthsvc_detectors.finding.Finding`:

- the **condition** a finding reports: its run, kind, metric and blamed rank set. As labels
  (:func:`condition_labels`, the alert's identity labels) ``rank`` names the set
  (:func:`rank_label`): the rank when a finding blames exactly one, its ranges when it blames
  several (a NaN on 512 ranks is one condition, ``rank="0-511"``), ``"*"`` when it is run-wide
  (blames none). Its :func:`fingerprint` (16 hex digits of SHA-256 over the sorted labels) is the
  alert's fingerprint; :func:`finding_fingerprint` gives it for a finding, so run health can tell
  which alert a stored finding belongs to.
- the **alert** a finding belongs to (:func:`alert_fingerprint`, the one function alerting and
  run health both ask): its condition's, unless that alert is not firing and another firing
  alert of the same run, kind and metric already blames some of the finding's ranks. Then the
  finding is that ongoing fault spreading, and joins its alert (whose ranks grow) instead of
  opening a second one: an alert keeps its identity as more ranks join, so the fault is paged
  once (a hang on rank 3 that spreads to ranks 3 and 4 stays the ``rank="3"`` alert).
- the **occurrence**: the condition at one step, firing or resolved, in one attempt
  (:func:`occurrence_key`, from ``Finding.identity``). It is unique per run in the store, so a
  replay after a restart never stores or announces a finding twice. Without step and status it
  is the **condition key** (:func:`condition_key`): a resolved finding resolves the firing
  findings of the same key.

>>> from healthsvc_detectors.finding import Finding
>>> f = Finding("loss_spike", step=120, metric="loss", ranks=(3,))
>>> condition_labels(f, "r1")
{'alertname': 'loss_spike', 'run': 'r1', 'rank': '3', 'metric': 'loss'}
>>> occurrence_key(2, f)
'2|loss_spike|loss|3|120|firing'
>>> condition_labels(Finding("hang", step=9, ranks=(8, 9, 10, 11, 20)), "r1")["rank"]
'8-11,20'
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Mapping, Protocol

import numpy as np

from healthsvc_detectors.finding import Finding

ALL_RANKS = "*"        # the rank label of a run-wide condition (no rank blamed)
MAX_RANK_LABEL = 64    # characters of a rank label; a longer set's ranges are cut and digested
IDENTITY_LABELS: tuple[str, ...] = ("alertname", "run", "rank", "metric")


def compact_ranks(ranks: tuple[int, ...] | list[int] | np.ndarray) -> str:
    """Sorted ranks as ranges: ``(0, 1, 2, 5, 7, 8) -> "0-2,5,7-8"`` (vectorised: run breaks)."""
    r = np.unique(np.asarray(ranks, dtype=np.int64))
    if r.size == 0:
        return ""
    breaks = np.flatnonzero(np.diff(r) != 1)
    starts = np.concatenate(([r[0]], r[breaks + 1]))
    ends = np.concatenate((r[breaks], [r[-1]]))
    return ",".join(str(s) if s == e else f"{s}-{e}" for s, e in zip(starts.tolist(), ends.tolist()))


def rank_label(ranks: tuple[int, ...]) -> str:
    """The ``rank`` label of a blamed rank set: its ranges, ``"*"`` when none. A set whose ranges
    run past ``MAX_RANK_LABEL`` characters (scattered ranks of a big job) keeps their start and a
    digest of the whole, so the label stays short and two sets never share it.

    >>> rank_label((3,)), rank_label(tuple(range(512))), rank_label(())
    ('3', '0-511', '*')
    >>> label = rank_label(tuple(range(0, 400, 2)))
    >>> len(label) <= 64, label[:12], label[-9:-8]
    (True, '0,2,4,6,8,10', '#')
    """
    if not ranks:
        return ALL_RANKS
    text = str(ranks[0]) if len(ranks) == 1 else compact_ranks(ranks)
    if len(text) <= MAX_RANK_LABEL:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    head = text[: MAX_RANK_LABEL - 13].rsplit(",", 1)[0]
    return f"{head},...#{digest}"


def condition_labels(finding: Finding, run_id: str) -> dict[str, str]:
    """Identity labels of the condition (and alert) a finding belongs to."""
    labels = {
        "alertname": finding.kind,
        "run": run_id,
        "rank": rank_label(finding.ranks),
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


class AlertLike(Protocol):
    """What :func:`alert_fingerprint` reads of an alert (``healthsvc.alerting.model.Alert``, a
    frozen dataclass: read-only members)."""
    @property
    def fingerprint(self) -> str: ...
    @property
    def labels(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def ranks(self) -> tuple[int, ...]: ...
    @property
    def starts_at(self) -> float: ...
    @property
    def ends_at(self) -> float | None: ...


def alert_fingerprint(run_id: str, finding: Finding, alerts: Iterable[AlertLike],
                      at: float | None = None) -> str:
    """The fingerprint of the alert ``finding`` belongs to, among the run's ``alerts``: the
    finding's own condition's, unless that one was not firing and another alert of the same
    kind and metric was, blaming some of the same ranks (it joins that one; see the module's
    docstring). Firing means firing now (``at=None``: alerting, folding a new finding) or at
    ``at`` (run health, asking which alert a finding stored then belongs to).

    >>> from types import SimpleNamespace as A
    >>> hang3 = A(fingerprint="h3", labels=(("alertname", "hang"), ("rank", "3"), ("run", "r")),
    ...           ranks=(3,), starts_at=0.0, ends_at=None)
    >>> alert_fingerprint("r", Finding("hang", step=9, ranks=(3, 4)), [hang3])
    'h3'
    >>> alert_fingerprint("r", Finding("hang", step=9, ranks=(5, 6)), [hang3]) == finding_fingerprint(
    ...     "r", Finding("hang", step=9, ranks=(5, 6)))
    True
    """
    own = finding_fingerprint(run_id, finding)
    key = {"alertname": finding.kind, "run": run_id, "metric": finding.metric or None}
    ranks = set(finding.ranks)
    joined = None
    for a in alerts:
        if not (a.starts_at <= at and (a.ends_at is None or a.ends_at >= at)
                if at is not None else a.ends_at is None):
            continue
        if a.fingerprint == own:
            return own
        labels = dict(a.labels)
        if (joined is None and ranks and labels.get("alertname") == key["alertname"]
                and labels.get("run") == run_id and labels.get("metric") == key["metric"]
                and not ranks.isdisjoint(a.ranks)):
            joined = a.fingerprint
    return joined or own


def condition_key(attempt: int, finding: Finding) -> tuple:
    """What a resolved finding resolves: the firing findings of the same attempt, kind, metric
    and ranks (``Finding.identity`` without step and status)."""
    kind, metric, ranks, _step, _status = finding.identity
    return (attempt, kind, metric, ranks)


def occurrence_key(attempt: int, finding: Finding) -> str:
    """The stored identity of one finding (unique per run): attempt, kind, metric, ranks, step,
    status, as ``|``-separated text (the format stored findings already carry)."""
    kind, metric, ranks, step, status = finding.identity
    return f"{attempt}|{kind}|{metric}|{','.join(map(str, ranks))}|{step}|{status}"
