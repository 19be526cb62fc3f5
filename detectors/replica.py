"""``replica_mismatch``: data-parallel replicas whose parameters stopped being identical.

Ranks of one replica group (``replica_group``; plain DDP: one group) must hold bit-identical
parameters after every update, so the digests they report at a step (``param_digest``, see
``healthsvc_client.fingerprint``; the block carries them as numeric codes, equal digests equal codes) must
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

A group's row is judged only when every member of the group reported its digest at that step. The
members are the ranks that have reported a digest in the group since the detector started (a new
attempt starts it again: :meth:`Detector.new_attempt`); a rank that reports later joins them. A
*partial row* (a member missing: its record is late, lost, or never sent because its process was
stopped mid-step, which is what the rows an attempt leaves behind at a restart look like) is
skipped whole: its digests neither prove the group agreed (the missing member may be the
corrupted one, so ``last_agreeing_step`` does not move and nothing resolves) nor say who is odd
(the missing member decides the majority: two digests that differ among four replicas name no
one). A real mismatch persists (the corrupted state stays), so it is named at the next complete
row. Its ranks still count as members. The first row of an attempt names the members as it finds
them: the caller hands on steps once every expected rank reported or their wait timed out
(``healthsvc.monitor.aligner``).

>>> import numpy as np
>>> from healthsvc_detectors.frame import StepBlock
>>> codes = np.array([[7., 7., 7., 7.], [9., 9., 5., 9.]])
>>> [(f.step, f.ranks, f.evidence["last_agreeing_step"]) for f in
...  ReplicaMismatchDetector().update(StepBlock.from_dense([10, 20], [0, 1, 2, 3], param_digest=codes))]
[(20, (2,), 10)]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from healthsvc_detectors.base import BlockDetector, Detector
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.frame import StepBlock


class ReplicaMismatchDetector(Detector, BlockDetector):
    """Names the ranks whose parameter digest disagrees with their replica group's majority.

    Parameters
    ----------
    metric: the digest column (numeric codes of ``param_digest``).
    group_metric: the replica group column; a rank that reports none is in group 0.
    """

    kind = "replica_mismatch"
    # Proof, not a statistic: it does not heal.
    kinds = (Kind("replica_mismatch", "Data-parallel replicas hold different parameters: proof of a corrupted replica.",
                  resolves="latched", mutes=frozenset(), corruption="abrupt", heals=False,
                  onset_guessed=False, probe=True, incident=None, restarts_at="warning", blames_host=True, label="replica mismatch",
                  colour="#000000"),)

    def __init__(self, metric: str = "param_digest", group_metric: str = "replica_group") -> None:
        self.metric = metric
        self.group_metric = group_metric
        super().__init__()

    def _reset(self) -> None:
        self._last_agree: dict[int, int] = {}      # group -> newest step at which it agreed
        self._odd: dict[int, list[int]] = {}       # group -> ranks named and not resolved
        self._members: dict[int, np.ndarray] = {}  # group -> ranks that reported a digest in it, sorted

    def _complete(self, group: int, ranks: np.ndarray) -> bool:
        """Whether the row's ``ranks`` (sorted) hold every member of ``group``; the row's ranks
        join the members either way."""
        members = self._members.get(group)
        if members is not None and len(members) == len(ranks) and (members == ranks).all():
            return True   # the usual row: the same ranks as every row before
        if members is None:
            self._members[group] = ranks.copy()
            return True
        complete = bool(np.isin(members, ranks, assume_unique=True).all())
        self._members[group] = np.union1d(members, ranks)
        return complete

    def update(self, block: StepBlock) -> list[Finding]:
        if not block.has(self.metric):
            return []
        codes, has = block.values[self.metric], block.present[self.metric]
        out: list[Finding] = []
        # Fingerprints come every few steps: the work is per fingerprint row, over its ranks.
        for i in np.flatnonzero(has.any(axis=1)):
            step = int(block.steps[i])
            row_has = has[i]
            everyone = bool(row_has.all())
            row_codes = codes[i] if everyone else codes[i][row_has]
            row_ranks = block.ranks if everyone else block.ranks[row_has]
            if self.group_metric in block.values:
                g = np.where(block.present[self.group_metric][i], block.values[self.group_metric][i], 0.0)
                row_groups = g if everyone else g[row_has]
            else:
                row_groups = None
            if row_groups is None or not row_groups.any():
                # The usual case: one group. Equal digests (min == max) prove agreement.
                if not self._complete(0, row_ranks):
                    continue
                if (len(row_codes) >= 2 and row_codes.min() == row_codes.max()
                        and not self._odd.get(0)):
                    self._last_agree[0] = step
                    continue
                out += self._judge(step, 0, row_ranks, row_codes)
                continue
            for gv in np.unique(row_groups):
                members = row_groups == gv
                if self._complete(int(gv), row_ranks[members]):
                    out += self._judge(step, int(gv), row_ranks[members], row_codes[members])
        return out

    def _judge(self, step: int, group: int, ranks: np.ndarray, codes: np.ndarray) -> list[Finding]:
        if len(ranks) < 2:
            return []
        named = self._odd.get(group, [])
        # A strict majority's digest is the median (the middle order statistic): found in linear
        # time, which settles the usual disagreement (one odd replica among many) without a sort.
        mid = np.partition(codes, len(codes) // 2)[len(codes) // 2]
        with_mid = codes == mid
        n_mid = int(with_mid.sum())
        if n_mid == len(codes):
            self._last_agree[group] = step
            if not named:
                return []
            self._odd.pop(group)
            return [Finding(kind=self.kind, step=step, ranks=tuple(named), severity="critical",
                            metric=self.metric, status="resolved",
                            evidence={"replica_group": group, "reason": "digests agree again"})]
        if 2 * n_mid > len(codes):
            odd, majority = ranks[~with_mid], n_mid
            distinct = None
        else:
            values, inverse, counts = np.unique(codes, return_inverse=True, return_counts=True)
            distinct = len(values)
            top = counts.max()
            leaders = np.flatnonzero(counts == top)
            if len(leaders) == 1:
                odd = ranks[inverse != leaders[0]]   # outside the largest agreeing set
                majority = int(top)
            else:
                odd = ranks                           # no largest set (say, two ranks): all named
                majority = 0
        known = set(named)
        new = sorted(int(r) for r in odd if int(r) not in known)
        if not new:
            return []
        if distinct is None:
            distinct = int(len(np.unique(codes[~with_mid]))) + 1
        self._odd[group] = sorted(known | set(new))
        last = self._last_agree.get(group)
        return [Finding(
            kind=self.kind, step=step, ranks=tuple(new), severity="critical", score=1.0,
            metric=self.metric, onset_step=None if last is None else last + 1,
            evidence={"replica_group": group, "last_agreeing_step": last,
                      "first_disagreeing_step": step, "group_ranks": int(len(ranks)),
                      "majority_ranks": majority, "distinct_digests": distinct,
                      "strict_majority": bool(majority * 2 > len(ranks))})]

    def state_dict(self) -> dict[str, Any]:
        return {"last_agree": {str(g): s for g, s in self._last_agree.items()},
                "odd": {str(g): r for g, r in self._odd.items()},
                "members": {str(g): m.tolist() for g, m in self._members.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        self._last_agree = {int(g): int(s) for g, s in state.get("last_agree", {}).items()}
        self._odd = {int(g): [int(r) for r in rs] for g, rs in state.get("odd", {}).items()}
        # A snapshot from before members were kept: the next row names them again.
        self._members = {int(g): np.asarray(m, dtype=np.int64) for g, m in state.get("members", {}).items()}


def redate(block: StepBlock, last_agreeing: int, first_disagreeing: int, group: int = 0,
           metric: str = "param_digest", group_metric: str = "replica_group") -> tuple[int, int]:
    """A finding's ``(last_agreeing_step, first_disagreeing_step)`` as the whole stored rows of
    ``block`` (the run's history, digests as codes) show them between those two steps.

    The detector judges a row only when every member reported (a partial row proves nothing),
    and a record that comes after the monitor stopped waiting for its step is late: the row was
    judged partial, so skipped, and the last agreement it knows is an older one. Once every rank
    has stored steps past the disagreement, the stored rows are whole: the newest whole row that
    agrees, before the first whole row that does not, is where the replicas last agreed. The
    members are the ranks of ``group`` with a digest in those rows. Never earlier than the
    detector's agreement (it saw that row whole) nor a later disagreement than its own.

    >>> codes = np.array([[1., 1., 1.], [2., 2., 0.], [3., 3., 9.]])
    >>> sent = np.array([[True, True, True], [True, True, False], [True, True, True]])
    >>> block = StepBlock(np.array([4, 9, 14]), np.arange(3), {"param_digest": codes},
    ...                   {"param_digest": sent})
    >>> redate(block, 4, 14)        # rank 2's digest of step 9 not stored: the detector's answer
    (4, 14)
    >>> sent[1, 2], codes[1, 2] = True, 2.0
    >>> redate(block, 4, 14)        # ... and once it is
    (9, 14)
    """
    if not block.has(metric):
        return last_agreeing, first_disagreeing
    rows = np.flatnonzero((block.steps >= last_agreeing) & (block.steps <= first_disagreeing))
    has = block.present[metric][rows]
    if group_metric in block.values:
        groups = np.where(block.present[group_metric][rows], block.values[group_metric][rows], 0.0)
        has = has & (groups == group)
    members = has.any(axis=0)
    if members.sum() < 2:
        return last_agreeing, first_disagreeing
    last = last_agreeing
    for i, row in zip(rows.tolist(), has[:, members]):
        if not row.all():
            continue   # still partial: proves nothing either way
        codes = block.values[metric][i][members]
        step = int(block.steps[i])
        if codes.min() != codes.max():
            return last, step
        last = max(last, step)
    return last, first_disagreeing
