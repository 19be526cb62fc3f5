"""What the ingest remembers about a run between batches: its current attempt and how far each
rank has got in it. Owned by the store's single writer thread; snapshotted into the store so a
restarted service resumes without rescanning history.

Attempts: steps repeat after a restart or rollback; every attempt is kept, and the run's
effective history is, for each step, the newest attempt that covers it. A new attempt opens at the
batch's smallest step when

- a record's ``incarnation`` (the id of the process that sent it, which the client changes when
  the process starts and when its own steps go back) differs from the one its rank has in the
  current attempt: the trainer said it restarted. A step a rank already reported, sent by the
  same incarnation, is late (a spool uploaded after the outage that filled it), not a restart;
- a record without an incarnation (an older client, a replay, ``curl``) repeats a step its rank
  already reported in the current attempt: told by step numbers alone.

An incarnation the run knew in an earlier attempt (a process from before the restart, its spool
uploaded late) is neither: the store routes such a batch to that attempt (``MetricsIngest``).

Memory is proportional to the ranks actually seen, not to the largest rank id: per-rank arrays
are aligned with ``ids`` (the sorted rank ids seen), so rank 50,000,000 costs one entry, not 50 M.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, TypeAlias

import numpy as np

from healthsvc_client.wire import INCARNATION_FIELD as INCARNATION   # the process that sent a record
from healthsvc.store.batch import MetricBatch


# Where a batch's ranks are in a run state's arrays: one position for a one-record batch, else
# one per record (RunState.progress_at, handed on to RunState.advance).
Positions: TypeAlias = "int | np.ndarray"


@dataclass(frozen=True)
class RunView:
    """What a committed write left of its run's state: handed on with every
    :class:`~healthsvc.store.results.IngestResult` and ``RunEvent``, so the stages after the
    store (the monitor) read the run's attempt, ranks and finish from the one owner,
    :class:`RunState`, instead of keeping counts of their own. Immutable: the writer thread goes
    on changing the state it was taken from.

    >>> RunState("r").view()
    RunView(attempt=0, start_step=0, ranks_seen=0, finished=False)
    """
    attempt: int
    start_step: int                   # first step of the attempt (-1: not known, in a replay)
    ranks_seen: int                   # ranks that reported in the current attempt
    finished: bool                    # the whole run finished (``runs.status`` says the same)


@dataclass(frozen=True)
class RunSnapshot:
    """A run's state as a thread other than the writer reads it (``store.reads.run_view``): a copy,
    so nothing outside the store holds the live :class:`RunState` the writer changes.

    >>> RunState("r").snapshot()
    RunSnapshot(attempt=0, start_step=0, ranks=(), max_step=-1, last_push=None, finished=False)
    """
    attempt: int
    start_step: int                   # first step of the current attempt
    ranks: tuple[int, ...]            # ranks that reported in the current attempt, ascending
    max_step: int                     # highest step of the current attempt; -1 before any
    last_push: float | None           # service clock of the last accepted batch
    finished: bool

    @property
    def ranks_seen(self) -> int:
        return len(self.ranks)


@dataclass
class RunState:
    run_id: str
    attempt: int = 0                  # 0 = nothing received yet
    start_step: int = 0               # first step of the current attempt
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # rank ids seen, sorted
    last_step: np.ndarray = field(default_factory=lambda: np.full(0, -1, dtype=np.int64))  # aligned with ids
    host_names: list[str] = field(default_factory=list)
    host_code: np.ndarray = field(default_factory=lambda: np.full(0, -1, dtype=np.int32))  # aligned with ids
    inc_names: list[str] = field(default_factory=list)   # incarnations met in the current attempt
    inc_code: np.ndarray = field(default_factory=lambda: np.full(0, -1, dtype=np.int32))  # aligned with ids, -1 none
    finished: bool = False            # the whole run finished
    finished_ranks: set[int] = field(default_factory=set)  # ranks that said finish in this attempt
    attempt_progress: dict[int, list[int]] = field(default_factory=dict)  # attempt -> [last step, records]
    last_push: float | None = None    # service clock of the last accepted batch
    # Distinct field names the run's chunks hold (metrics and string fields), for the quota on
    # them; None in a snapshot of an earlier release (the store reads them from the chunks).
    metric_names: set[str] | None = field(default_factory=set)
    # (the ids array judged, whether it is 0..n-1): see _positions. Not state: not compared.
    _dense: tuple[np.ndarray | None, bool] = field(default=(None, False), compare=False, repr=False)

    def new_names(self, batch: MetricBatch) -> list[str]:
        """The batch's field names the run has not had yet (a set comparison on the usual push)."""
        known = self.metric_names
        if known and batch.values.keys() <= known and (not batch.labels or batch.labels.keys() <= known):
            return []
        return sorted(n for n in (*batch.values, *batch.labels) if not known or n not in known)

    def record_push(self, step_max: int, n_records: int, now: float, attempt: int | None = None) -> None:
        prog = self.attempt_progress.setdefault(self.attempt if attempt is None else attempt, [step_max, 0])
        prog[0] = max(prog[0], step_max)
        prog[1] += n_records
        self.last_push = now

    def _grow(self, ranks: np.ndarray) -> np.ndarray:
        """Make room for ``ranks``; returns their positions in ``ids``."""
        ranks = np.asarray(ranks, dtype=np.int64)
        pos, known = self._positions(ranks)
        if not known.all():
            merged = np.union1d(self.ids, ranks[~known])
            where = np.searchsorted(merged, self.ids)
            last, code = np.full(len(merged), -1, np.int64), np.full(len(merged), -1, np.int32)
            inc = np.full(len(merged), -1, np.int32)
            last[where], code[where], inc[where] = self.last_step, self.host_code, self.inc_code
            self.ids, self.last_step, self.host_code, self.inc_code = merged, last, code, inc
            pos = np.searchsorted(self.ids, ranks)
        return pos

    def _positions(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of ``ranks`` in ``ids`` (read only; where an unknown rank would go), and
        which of them are known.

        A job's ranks are nearly always 0..n-1: then ``ids`` is ``arange(n)`` and a rank is its
        own position, which spares the binary search a push of many ranks did two or three times
        (the most of the run state's cost per push). Whether ``ids`` is dense is noted with the
        array it was judged on (one tuple: any thread reads a consistent pair)."""
        ids = self.ids
        judged, dense = self._dense
        if judged is not ids:
            dense = len(ids) == 0 or (int(ids[0]) == 0 and int(ids[-1]) == len(ids) - 1)
            self._dense = (ids, dense)
        if dense and len(ranks) > 1 and ranks.dtype == np.int64:
            # As unsigned, a negative rank (never in a batch) is beyond every id: not known.
            known = ranks.view(np.uint64) < len(ids)
            if known.all():
                return ranks, known
        pos = np.searchsorted(ids, ranks)
        known = pos < len(ids)
        known[known] = ids[pos[known]] == ranks[known]
        return pos, known

    # -- attempts -------------------------------------------------------------------------
    def _incarnations(self, batch: MetricBatch, older: frozenset[str] = frozenset()
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Per record of the batch (read only): its incarnation's code in ``inc_names`` (-1: none
        reported, -2: not met in this attempt, -3: one of ``older``), its rank's incarnation in
        the attempt (-1: none known) and whether its rank is known; None when the batch reports
        no incarnation."""
        label = batch.labels.get(INCARNATION)
        if label is None:
            return None
        names, idx = label
        lookup = self._inc_lookup()
        codes = np.array([-3 if n in older else lookup.get(n, -2) for n in names] + [-1], dtype=np.int32)[idx]
        pos, known = self._positions(batch.ranks)
        current = np.full(len(batch), -1, dtype=np.int32)
        current[known] = self.inc_code[pos[known]]
        return codes, current, known

    def incarnation_misses(self, batch: MetricBatch) -> np.ndarray:
        """The ranks (unique) whose records report an incarnation other than the one the attempt
        knows for them: restarted, from before a restart, or not met here yet (on a database
        shared by replicas, another replica may know them). The store looks these up."""
        inc = self._incarnations(batch)
        if inc is None:
            return np.zeros(0, dtype=np.int64)
        codes, current, _ = inc
        return np.unique(batch.ranks[(codes != -1) & (codes != current)])

    def learn_incarnations(self, pairs: Sequence[tuple[int, str]]) -> None:
        """(rank, incarnation) pairs of the current attempt stored by another write (another
        replica's, or before this state was loaded): committed facts, so learning them changes
        nothing a failed job must undo. A rank's own known incarnation is kept."""
        if not pairs:
            return
        pos = self._grow(np.array([r for r, _ in pairs], dtype=np.int64))
        for at, (_, name) in zip(pos.tolist(), pairs):
            if self.inc_code[at] < 0:
                self.inc_code[at] = self._inc_code_of(name)

    def needs_new_attempt(self, batch: MetricBatch, older: frozenset[str] = frozenset()) -> bool:
        """True for the first batch of a run, and for a restart or rollback (the module's rules:
        an incarnation its rank did not have in the attempt, or, for records without one, a step
        the rank already reported). ``older``: incarnations of earlier attempts, never a restart.

        >>> def batch(steps, ranks, inc): return MetricBatch(np.array(steps), np.array(ranks),
        ...     labels={"incarnation": ([inc], np.zeros(len(steps), np.int32))})
        >>> st = RunState("r"); _ = st.open_attempt(0); st.advance(batch([5, 6], [0, 0], "a"))
        >>> st.needs_new_attempt(batch([3], [0], "a")), st.needs_new_attempt(batch([7], [0], "b"))
        (False, True)
        >>> st.needs_new_attempt(batch([3], [0], "old"), older=frozenset({"old"}))
        False
        """
        if self.attempt == 0 or len(batch) == 0:
            return self.attempt == 0 and len(batch) > 0
        pos, known = self._positions(batch.ranks)
        repeats = np.zeros(len(batch), dtype=bool)
        repeats[known] = batch.steps[known] <= self.last_step[pos[known]]
        inc = self._incarnations(batch, older)
        if inc is None:
            return bool(repeats.any())
        codes, current, _ = inc
        restarted = (codes >= -2) & (codes != -1) & (current >= 0) & (codes != current)
        by_steps = ((codes == -1) | (current < 0)) & (codes != -3)
        return bool(restarted.any() or (repeats & by_steps).any())

    def late(self, batch: MetricBatch) -> bool:
        """True when every record is a step its rank already passed, sent by the incarnation the
        rank has in the attempt: filling a gap (a spool uploaded late), not a resume after a
        finish."""
        inc = self._incarnations(batch)
        if inc is None or len(batch) == 0:
            return False
        codes, current, known = inc
        pos, _ = self._positions(batch.ranks)
        behind = np.zeros(len(batch), dtype=bool)
        behind[known] = batch.steps[known] <= self.last_step[pos[known]]
        return bool(((codes >= 0) & (codes == current) & behind).all())

    def progress_at(self, batch: MetricBatch) -> Positions | None:
        """When every rank of the batch has reported in the current attempt, each of its steps is
        beyond that rank's last and each reported incarnation is its rank's (neither a new attempt
        nor a new rank): the positions of the batch's ranks in ``ids``; else None (read only).
        The store hands them to :meth:`advance`, which then does not look the ranks up a second
        time (the usual push's two lookups were the most of the run state's cost per push).

        >>> def batch(steps, ranks): return MetricBatch(np.array(steps), np.array(ranks))
        >>> st = RunState("r"); st.open_attempt(0); st.advance(batch([0, 0], [0, 1]))
        1
        >>> st.progress_at(batch([1], [1])), st.progress_at(batch([0], [1]))
        (1, None)
        >>> st.progress_at(batch([1], [2])) is None   # rank 2 is new in the attempt
        True
        """
        if len(batch) == 1:
            return self._one_record_progress(batch)
        return self._progress_of_records(batch)

    def _one_record_progress(self, batch: MetricBatch) -> int | None:
        """:meth:`progress_at` of a rank's own push (one record), in Python scalars: numpy's
        cost per call was most of it (``tests/service/test_runstate.py`` holds it to the
        general way)."""
        at = self._position_of(int(batch.ranks[0]))
        if at < 0:
            return None
        last = int(self.last_step[at])
        if last < 0 or int(batch.steps[0]) <= last:
            return None
        label = batch.labels.get(INCARNATION)
        if label is None or label[1][0] < 0:
            return at
        return at if self._inc_lookup().get(label[0][int(label[1][0])], -2) == int(self.inc_code[at]) else None

    def _position_of(self, rank: int) -> int:
        """Position of ``rank`` in ``ids``, -1 if not known."""
        at = int(self.ids.searchsorted(rank))
        return at if at < len(self.ids) and int(self.ids[at]) == rank else -1

    def _progress_of_records(self, batch: MetricBatch) -> np.ndarray | None:
        pos, known = self._positions(batch.ranks)
        if not known.all():
            return None
        last = self.last_step[pos]
        if not ((last >= 0).all() and (batch.steps > last).all()):
            return None
        inc = self._incarnations(batch)
        return pos if inc is None or bool(((inc[0] == -1) | (inc[0] == inc[1])).all()) else None

    def open_attempt(self, start_step: int) -> int:
        return self.join_attempt(self.attempt + 1, start_step)

    def join_attempt(self, attempt: int, start_step: int) -> int:
        """Go on in ``attempt`` (opened here, or by another replica: see ``MetricsIngest``), with
        no step of it seen yet."""
        self.attempt = int(attempt)
        self.start_step = int(start_step)
        self.last_step[:] = -1
        self.inc_code[:] = -1
        self.inc_names.clear()
        self._inc_by_name: dict[str, int] | None = None
        self.finished = False
        self.finished_ranks.clear()
        return self.attempt

    def advance(self, batch: MetricBatch, at: Positions | None = None) -> None:
        """The batch's ranks have reported its steps and incarnations. ``at``: what
        :meth:`progress_at` said of the batch (its ranks' positions; nothing changed since)."""
        if len(batch) == 0:
            return
        if len(batch) == 1:
            self._advance_one_record(batch, at if isinstance(at, int) else None)
            return
        self._advance_records(batch, at if isinstance(at, np.ndarray) else None)

    def _advance_one_record(self, batch: MetricBatch, at: int | None = None) -> None:
        """:meth:`advance` by a rank's own push (one record), in Python scalars."""
        if at is None:
            at = self._position_of(int(batch.ranks[0]))
            if at < 0:
                at = int(self._grow(batch.ranks)[0])
        step = int(batch.steps[0])
        if step > self.last_step[at]:
            self.last_step[at] = step
        label = batch.labels.get(INCARNATION)
        if label is not None:
            names, idx = label
            codes = [self._inc_code_of(n) for n in names]
            if idx[0] >= 0:
                self.inc_code[at] = codes[int(idx[0])]

    def _advance_records(self, batch: MetricBatch, pos: np.ndarray | None = None) -> None:
        progress = pos is not None     # every record is beyond its rank's last step
        if pos is None:
            pos = self._grow(batch.ranks)  # first: it may replace the arrays
        first, last = batch.step_bounds
        if progress and first == last:   # one step of many ranks (the usual push): it is each one's newest
            self.last_step[pos] = last
        else:
            np.maximum.at(self.last_step, pos, batch.steps)
        label = batch.labels.get(INCARNATION)
        if label is not None:
            names, idx = label
            codes = np.array([self._inc_code_of(n) for n in names] + [-1], dtype=np.int32)[idx]
            has = codes >= 0
            self.inc_code[pos[has]] = codes[has]   # a rank's last record wins

    def new_incarnations(self, batch: MetricBatch, *, new_attempt: bool = False) -> list[tuple[int, str]]:
        """(rank, incarnation) pairs the batch brings that the attempt does not know yet (all of
        them when the batch opens a new attempt), one per pair (read only): what the store
        records so other replicas, and later loads, know them."""
        label = batch.labels.get(INCARNATION)
        if label is None:
            return []
        names, idx = label
        inc = self._incarnations(batch)
        if inc is None:   # not reached: None only without the label
            return []
        codes, current, _ = inc
        new = (idx >= 0) if new_attempt else (codes != -1) & (codes != current)
        return sorted({(int(r), names[int(i)]) for r, i in zip(batch.ranks[new], idx[new])})

    def _inc_code_of(self, name: str) -> int:
        lookup = self._inc_lookup()
        code = lookup.get(name)
        if code is None:
            code = lookup[name] = len(self.inc_names)
            self.inc_names.append(name)
        return code

    def _inc_lookup(self) -> dict[str, int]:
        # Derived from inc_names, as _host_lookup from host_names.
        cached = getattr(self, "_inc_by_name", None)
        if cached is None or len(cached) != len(self.inc_names):
            cached = self._inc_by_name = {name: i for i, name in enumerate(self.inc_names)}
        return cached

    def host_updates(self, batch: MetricBatch) -> list[tuple[int, str]]:
        """(rank, host) pairs the batch brings that differ from what the run knows (the last
        report of a rank wins). Reads only: apply them with :meth:`set_hosts`."""
        if batch.host_index is None or len(batch) == 0:
            return []
        has = batch.host_index >= 0
        if not has.any():
            return []
        ranks, idx = batch.ranks[has], batch.host_index[has]
        uniq, pos = np.unique(ranks[::-1], return_index=True)
        last = idx[::-1][pos]
        lookup = self._host_lookup()
        batch_codes = np.array([lookup.get(name, -2) for name in batch.host_names], dtype=np.int32)
        known = np.full(len(uniq), -1, dtype=np.int32)
        pos, inside = self._positions(uniq)
        known[inside] = self.host_code[pos[inside]]
        changed = batch_codes[last] != known
        return [(int(r), batch.host_names[int(i)]) for r, i in zip(uniq[changed], last[changed])]

    def set_hosts(self, pairs: list[tuple[int, str]]) -> None:
        if not pairs:
            return
        positions = self._grow(np.array([r for r, _ in pairs], dtype=np.int64))
        lookup = self._host_lookup()
        for (rank, host), at in zip(pairs, positions):  # only ranks whose host changed: few after the first batch
            code = lookup.get(host)
            if code is None:
                code = lookup[host] = len(self.host_names)
                self.host_names.append(host)
            self.host_code[at] = code

    def _host_lookup(self) -> dict[str, int]:
        # Derived from host_names (not state); rebuilt when names were added elsewhere.
        cached = getattr(self, "_lookup", None)
        if cached is None or len(cached) != len(self.host_names):
            cached = self._lookup = {name: i for i, name in enumerate(self.host_names)}
        return cached

    def view(self) -> RunView:
        return RunView(self.attempt, self.start_step, int(np.count_nonzero(self.last_step >= 0)), self.finished)

    def hosts_of(self, ranks: Sequence[int]) -> tuple[str | None, ...]:
        """The host of each rank (None where unknown), aligned with ``ranks``: the one shape
        hosts travel in, from here to stored findings and alerts.

        >>> st = RunState("r"); st.set_hosts([(3, "node-a")])
        >>> st.hosts_of((3, 4))
        ('node-a', None)
        """
        if not len(ranks):
            return ()
        pos, known = self._positions(np.asarray(ranks, dtype=np.int64))
        codes = np.full(len(pos), -1, dtype=np.int32)
        codes[known] = self.host_code[pos[known]]
        return tuple(self.host_names[c] if c >= 0 else None for c in codes.tolist())

    def hosts_for_reader(self, ranks: Sequence[int]) -> tuple[str | None, ...]:
        """:meth:`hosts_of` for a thread other than the writer (the run's owner, naming its
        findings' hosts before their job). The writer swaps ``ids`` and ``host_code`` one after
        the other when ranks join, and a join moves the known ranks' positions: a read that paired
        one generation's ``ids`` with the other's codes would name another rank's host. So the
        pair is read first and used only when it belongs together (arrays only grow, so equal
        lengths are one generation), and positions are found in that ``ids``, not the live one.
        A host set after the read is missed (None)."""
        want = np.asarray(ranks, dtype=np.int64)
        while True:
            ids, codes = self.ids, self.host_code
            if len(ids) == len(codes):
                break
        names = list(self.host_names)
        pos = np.searchsorted(ids, want)
        known = pos < len(ids)
        known[known] = ids[pos[known]] == want[known]
        found = np.full(len(want), -1, dtype=np.int64)
        found[known] = codes[pos[known]]
        return tuple(names[c] if 0 <= c < len(names) else None for c in found.tolist())

    def ranks_seen(self) -> np.ndarray:
        return self.ids[self.last_step >= 0]

    def snapshot(self) -> "RunSnapshot":
        """An immutable copy for another thread (:meth:`healthsvc.store.Store.run_view`).

        The writer thread goes on changing this state while a reader copies it, and when ranks
        join it swaps the per-rank arrays one after the other; a copy whose arrays differ in
        length saw half a swap and is taken again (the swap is a few assignments: the next try
        sees it whole)."""
        while True:
            ids, last = self.ids, self.last_step
            attempt, start, finished, last_push = self.attempt, self.start_step, self.finished, self.last_push
            if len(ids) == len(last):
                seen = ids[last >= 0]
                return RunSnapshot(attempt, start, tuple(int(r) for r in seen),
                                   int(last.max()) if len(last) else -1, last_push, finished)

    def ranks_not_past(self, step: int) -> tuple[int, ...]:
        """The ranks seen in the current attempt whose newest stored step is ``step`` or less,
        ascending; for any thread (copied like :meth:`snapshot`, retried across a half-seen swap
        of the per-rank arrays).

        >>> st = RunState("r"); _ = st.open_attempt(0)
        >>> st.advance(MetricBatch(np.array([5, 7]), np.array([0, 1]))); st.ranks_not_past(6)
        (0,)
        """
        while True:
            ids, last = self.ids, self.last_step
            if len(ids) == len(last):
                seen = last >= 0
                return tuple(int(r) for r in ids[seen & (last <= step)])

    def unseen_ranks(self, batch: MetricBatch) -> np.ndarray:
        """The batch's ranks (unique, sorted) not seen yet in the current attempt (read only)."""
        ranks = np.unique(batch.ranks)
        pos, known = self._positions(ranks)
        known[known] = self.last_step[pos[known]] >= 0
        return ranks[~known]

    def max_step(self) -> int:
        return int(self.last_step.max()) if len(self.last_step) else -1

    def host_of(self, rank: int) -> str | None:
        pos, known = self._positions(np.array([rank], dtype=np.int64))
        if known[0] and self.host_code[pos[0]] >= 0:
            return self.host_names[int(self.host_code[pos[0]])]
        return None

    # -- snapshot -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        seen = (self.last_step >= 0) | (self.host_code >= 0) | (self.inc_code >= 0)
        return {"attempt": self.attempt, "start_step": self.start_step, "finished": self.finished,
                "finished_ranks": sorted(self.finished_ranks),
                "ranks": self.ids[seen].tolist(), "last_step": self.last_step[seen].tolist(),
                "host_code": self.host_code[seen].tolist(), "host_names": self.host_names,
                "inc_code": self.inc_code[seen].tolist(), "inc_names": self.inc_names,
                "metric_names": sorted(self.metric_names or ())}

    @classmethod
    def from_dict(cls, run_id: str, d: dict) -> "RunState":
        st = cls(run_id=run_id, attempt=d["attempt"], start_step=d["start_step"],
                 finished=d.get("finished", False), host_names=list(d["host_names"]),
                 finished_ranks=set(d.get("finished_ranks", ())), inc_names=list(d.get("inc_names", ())),
                 metric_names=set(d["metric_names"]) if "metric_names" in d else None)
        ranks = np.asarray(d["ranks"], dtype=np.int64)
        if len(ranks):
            pos = st._grow(ranks)
            st.last_step[pos] = d["last_step"]
            st.host_code[pos] = d["host_code"]
            if "inc_code" in d:   # snapshots from before incarnations have none
                st.inc_code[pos] = d["inc_code"]
        return st
