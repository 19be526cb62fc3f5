"""What the ingest remembers about a run between batches: its current attempt and how far each
rank has got in it. Owned by the store's single writer thread; snapshotted into the store so a
restarted service resumes without rescanning history.

Attempts: steps repeat after a restart or rollback. When a batch brings a step that a rank has
already reported in the current attempt, a new attempt opens at the batch's smallest step; every
attempt is kept, and the run's effective history is, for each step, the newest attempt that
covers it.

Memory is proportional to the ranks actually seen, not to the largest rank id: per-rank arrays
are aligned with ``ids`` (the sorted rank ids seen), so rank 50,000,000 costs one entry, not 50 M.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from healthsvc.ingest.batch import MetricBatch


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


@dataclass
class RunState:
    run_id: str
    attempt: int = 0                  # 0 = nothing received yet
    start_step: int = 0               # first step of the current attempt
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # rank ids seen, sorted
    last_step: np.ndarray = field(default_factory=lambda: np.full(0, -1, dtype=np.int64))  # aligned with ids
    host_names: list[str] = field(default_factory=list)
    host_code: np.ndarray = field(default_factory=lambda: np.full(0, -1, dtype=np.int32))  # aligned with ids
    finished: bool = False            # the whole run finished
    finished_ranks: set[int] = field(default_factory=set)  # ranks that said finish in this attempt
    attempt_progress: dict[int, list[int]] = field(default_factory=dict)  # attempt -> [last step, records]
    last_push: float | None = None    # service clock of the last accepted batch

    def record_push(self, step_max: int, n_records: int, now: float) -> None:
        prog = self.attempt_progress.setdefault(self.attempt, [step_max, 0])
        prog[0] = max(prog[0], step_max)
        prog[1] += n_records
        self.last_push = now

    def _grow(self, ranks: np.ndarray) -> np.ndarray:
        """Make room for ``ranks``; returns their positions in ``ids``."""
        ranks = np.asarray(ranks, dtype=np.int64)
        pos = np.searchsorted(self.ids, ranks)
        known = pos < len(self.ids)
        known[known] = self.ids[pos[known]] == ranks[known]
        if not known.all():
            merged = np.union1d(self.ids, ranks[~known])
            where = np.searchsorted(merged, self.ids)
            last, code = np.full(len(merged), -1, np.int64), np.full(len(merged), -1, np.int32)
            last[where], code[where] = self.last_step, self.host_code
            self.ids, self.last_step, self.host_code = merged, last, code
            pos = np.searchsorted(self.ids, ranks)
        return pos

    def _positions(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of ``ranks`` in ``ids`` (read only), and which of them are known."""
        pos = np.searchsorted(self.ids, ranks)
        known = pos < len(self.ids)
        known[known] = self.ids[pos[known]] == ranks[known]
        return pos, known

    def needs_new_attempt(self, batch: MetricBatch) -> bool:
        """True for the first batch of a run, and when the batch repeats a step some rank already
        reported in the current attempt (a restart or rollback)."""
        if self.attempt == 0 or len(batch) == 0:
            return self.attempt == 0 and len(batch) > 0
        pos, known = self._positions(batch.ranks)
        return bool(np.any(batch.steps[known] <= self.last_step[pos[known]]))

    def only_progress(self, batch: MetricBatch) -> bool:
        """True when every rank of the batch has reported in the current attempt and each of its
        steps is beyond that rank's last: neither a new attempt nor a new rank (read only).

        >>> def batch(steps, ranks): return MetricBatch(np.array(steps), np.array(ranks))
        >>> st = RunState("r"); st.open_attempt(0); st.advance(batch([0, 0], [0, 1]))
        1
        >>> st.only_progress(batch([1], [1])), st.only_progress(batch([0], [1]))
        (True, False)
        >>> st.only_progress(batch([1], [2]))   # rank 2 is new in the attempt
        False
        """
        pos, known = self._positions(batch.ranks)
        if not known.all():
            return False
        last = self.last_step[pos]
        return bool((last >= 0).all() and (batch.steps > last).all())

    def open_attempt(self, start_step: int) -> int:
        return self.join_attempt(self.attempt + 1, start_step)

    def join_attempt(self, attempt: int, start_step: int) -> int:
        """Go on in ``attempt`` (opened here, or by another replica: see ``MetricsIngest``), with
        no step of it seen yet."""
        self.attempt = int(attempt)
        self.start_step = int(start_step)
        self.last_step[:] = -1
        self.finished = False
        self.finished_ranks.clear()
        return self.attempt

    def advance(self, batch: MetricBatch) -> None:
        if len(batch) == 0:
            return
        pos = self._grow(batch.ranks)  # first: it may replace the arrays
        np.maximum.at(self.last_step, pos, batch.steps)

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

    def ranks_seen(self) -> np.ndarray:
        return self.ids[self.last_step >= 0]

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
        seen = (self.last_step >= 0) | (self.host_code >= 0)
        return {"attempt": self.attempt, "start_step": self.start_step, "finished": self.finished,
                "finished_ranks": sorted(self.finished_ranks),
                "ranks": self.ids[seen].tolist(), "last_step": self.last_step[seen].tolist(),
                "host_code": self.host_code[seen].tolist(), "host_names": self.host_names}

    @classmethod
    def from_dict(cls, run_id: str, d: dict) -> "RunState":
        st = cls(run_id=run_id, attempt=d["attempt"], start_step=d["start_step"],
                 finished=d.get("finished", False), host_names=list(d["host_names"]),
                 finished_ranks=set(d.get("finished_ranks", ())))
        ranks = np.asarray(d["ranks"], dtype=np.int64)
        if len(ranks):
            pos = st._grow(ranks)
            st.last_step[pos] = d["last_step"]
            st.host_code[pos] = d["host_code"]
        return st
