"""``replica_mismatch``: data-parallel replicas whose parameters stopped being identical.

Ranks of one replica group (``replica_group``; plain DDP: one group) must hold bit-identical
parameters after every update, so the digests they report at a step (``param_digest``, see
``clients.fingerprint``; the block carries them as numeric codes, equal digests equal codes) must
be equal. This needs no statistics: one disagreement is proof that some replica's state was
corrupted by an update after the last step at which the group agreed.

At a step where a group's digests disagree, the odd ranks are those outside the strict majority
(a bit flip on one of 8 ranks names that rank); without a strict majority (two ranks, or a 2-2
split) every rank outside the largest agreeing set is named, and when there is no largest set (two
ranks that disagree) both are. The finding is ``critical`` with score 1, fires once per odd rank
at the first disagreeing step, and carries ``last_agreeing_step`` (the newest step at which the
whole group agreed; None when it never did in this attempt) and ``first_disagreeing_step``. Its
``onset_step`` is ``last_agreeing_step + 1``: the first update that may have corrupted the state.
When the group agrees again (the trainer re-synchronised its replicas), a ``resolved`` finding
follows. Steps without digests (fingerprints are sent every few steps) are skipped.

>>> import numpy as np
>>> from detectors.frame import StepBlock
>>> codes = np.array([[7., 7., 7., 7.], [9., 9., 5., 9.]])
>>> [(f.step, f.ranks, f.evidence["last_agreeing_step"]) for f in
...  ReplicaMismatchDetector().update(StepBlock.from_dense([10, 20], [0, 1, 2, 3], param_digest=codes))]
[(20, (2,), 10)]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from detectors.base import BlockDetector, Detector
from detectors.finding import Finding
from detectors.frame import StepBlock


class ReplicaMismatchDetector(Detector, BlockDetector):
    """Names the ranks whose parameter digest disagrees with their replica group's majority.

    Parameters
    ----------
    metric: the digest column (numeric codes of ``param_digest``).
    group_metric: the replica group column; a rank that reports none is in group 0.
    """

    kind = "replica_mismatch"

    def __init__(self, metric: str = "param_digest", group_metric: str = "replica_group") -> None:
        self.metric = metric
        self.group_metric = group_metric
        super().__init__()

    def _reset(self) -> None:
        self._last_agree: dict[int, int] = {}      # group -> newest step at which it agreed
        self._odd: dict[int, list[int]] = {}       # group -> ranks named and not resolved

    def update(self, block: StepBlock) -> list[Finding]:
        if not block.has(self.metric):
            return []
        codes, has = block.values[self.metric], block.present[self.metric]
        if self.group_metric in block.values:
            groups = np.where(block.present[self.group_metric], block.values[self.group_metric], 0.0)
        else:
            groups = np.zeros(codes.shape)
        out: list[Finding] = []
        rows = np.flatnonzero(has.any(axis=1))      # fingerprint steps only
        if not len(rows):
            return out
        # The usual case, vectorised: one group whose reported digests are all equal.
        sub, sub_has = codes[rows], has[rows]
        with np.errstate(invalid="ignore"):
            lo = np.nanmin(np.where(sub_has, sub, np.inf), axis=1)
            hi = np.nanmax(np.where(sub_has, sub, -np.inf), axis=1)
        one_group = bool((groups[rows][sub_has] == 0).all())
        agree = (lo == hi) & (sub_has.sum(axis=1) >= 2) & one_group
        for k, i in enumerate(rows):
            step = int(block.steps[i])
            if agree[k] and not self._odd.get(0):
                self._last_agree[0] = step
                continue
            row_has = has[i]
            for g in np.unique(groups[i][row_has]):
                members = row_has & (groups[i] == g)
                out += self._judge(step, int(g), block.ranks[members], codes[i][members])
        return out

    def _judge(self, step: int, group: int, ranks: np.ndarray, codes: np.ndarray) -> list[Finding]:
        if len(ranks) < 2:
            return []
        values, inverse, counts = np.unique(codes, return_inverse=True, return_counts=True)
        named = self._odd.get(group, [])
        if len(values) == 1:
            self._last_agree[group] = step
            if not named:
                return []
            self._odd.pop(group)
            return [Finding(kind=self.kind, step=step, ranks=tuple(named), severity="critical",
                            metric=self.metric, status="resolved",
                            evidence={"replica_group": group, "reason": "digests agree again"})]
        top = counts.max()
        leaders = np.flatnonzero(counts == top)
        if len(leaders) == 1:
            odd = ranks[inverse != leaders[0]]   # outside the largest agreeing set
            majority = int(top)
        else:
            odd = ranks                           # no largest set (say, two ranks): all named
            majority = 0
        new = sorted(int(r) for r in odd if int(r) not in named)
        if not new:
            return []
        self._odd[group] = sorted(set(named) | set(new))
        last = self._last_agree.get(group)
        return [Finding(
            kind=self.kind, step=step, ranks=tuple(new), severity="critical", score=1.0,
            metric=self.metric, onset_step=None if last is None else last + 1,
            evidence={"replica_group": group, "last_agreeing_step": last,
                      "first_disagreeing_step": step, "group_ranks": int(len(ranks)),
                      "majority_ranks": majority, "distinct_digests": int(len(values)),
                      "strict_majority": bool(majority * 2 > len(ranks))})]

    def state_dict(self) -> dict[str, Any]:
        return {"last_agree": {str(g): s for g, s in self._last_agree.items()},
                "odd": {str(g): r for g, r in self._odd.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        self._last_agree = {int(g): int(s) for g, s in state.get("last_agree", {}).items()}
        self._odd = {int(g): [int(r) for r in rs] for g, rs in state.get("odd", {}).items()}
