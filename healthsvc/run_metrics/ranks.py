"""A bounded top-k of per-rank series: the ranks worth a line in Grafana, at most k per run.

A run has up to 16,384 ranks; a series per rank would be 16,384 series per run per field. So only
``metrics_top_ranks`` ranks per run (default 8) are exported: first the ranks named by the run's
active findings (the on-call engineer's suspects, worst severity first), then the slowest ranks
by the ratio of their newest timing to the median of all ranks' newest: ``compute_time`` when
the run reports it (in synchronous training every rank waits at the collective, so ``step_time``
is nearly equal on all ranks and ``compute_time`` shows the straggler), else ``step_time``.
A ratio of 2.0 is "twice as slow as its peers", whatever the job's own speed.

Pushes only hand their batches over (the writer thread does that for every push: an append,
no numpy call); the newest value of each rank is folded in when a scrape asks, or when a run
holds ``FOLD_AT_RECORDS`` pending records or ``FOLD_AT_PUSHES`` pending pushes. Then the pending
pushes are first pruned: when the newest leaves nothing of the others standing (the same ranks,
all newer, every timing field they report finite everywhere: the usual steps of a job), it is
kept alone and nothing is folded yet; only pushes that do not prune are folded. So a busy run's
fold is of its newest push alone, at most once a scrape, and the writer thread's cost a push is
one check every few pushes (folding 64 pushes of 1,024 records cost the writer thread 117 us a
push, most of it a sort and scatters of 65,536 records that the next push overwrote anyway; a
check of each large push against the one before it, 21 us, most of it numpy calls that release
and take back the GIL).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any, Iterable

import numpy as np

from healthsvc_detectors.finding import SEVERITY_ORDER

TIMING_FIELDS = ("compute_time", "step_time")   # the first one a run reports is the one ranked
FOLD_AT_RECORDS = 1 << 13                        # pending records that trigger a prune or fold at push time
# ... or pending pushes: each holds a batch (five objects the garbage collector tracks), and a
# run of one-record pushes held 65,536 of them until a scrape: the collections they caused, and
# the full ones walking them, cost every thread (in process, under the ingest bench's pushes:
# dozens of young collections where 91dd201 had none). A fold of 256 small pushes is cheap.
FOLD_AT_PUSHES = 256


@dataclass
class _RankTable:
    """Newest value per rank of one run, per field, and each rank's host (sorted rank ids).
    Newest by (attempt, step), not by arrival: a spool uploaded late must not overwrite."""
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    values: dict[str, np.ndarray] = field(default_factory=dict)   # field -> newest value (NaN: none)
    at: dict[str, np.ndarray] = field(default_factory=dict)       # field -> its (attempt, step) key, -1 none
    host_code: np.ndarray = field(default_factory=lambda: np.full(0, -1, np.int32))
    host_names: list[str] = field(default_factory=list)
    host_codes: dict[str, int] = field(default_factory=dict)

    def fold(self, pending: list[tuple[int, Any]]) -> None:
        """(attempt, batch) pairs, oldest first, in one pass: their records are concatenated and
        sorted once (one sort of everything pending, not one per push: the fixed numpy cost per
        call was most of a fold). For each field, a rank's newest reported finite value wins.

        The sort is by (attempt, step) alone, stable, and the values are then written in that
        order: of a rank's records the newest is written last and stays (numpy assigns repeated
        indices in order), ties going to the later arrival. Pushes come nearly in step order,
        so the sort is close to linear (a sort by rank first, as a lexsort, was the fold's cost)."""
        if not pending:
            return
        batches = [b for _, b in pending]
        ranks = np.concatenate([b.ranks for b in batches]).astype(np.int64, copy=False)
        # (attempt, step) as one integer: the attempts spread over their batches' records in one
        # call, not a shifted copy of every batch's steps (bench/run_series.py: the ranks' series
        # 0.73x at 1-record pushes, which fold 256 at a time).
        attempts = np.repeat(np.array([a for a, _ in pending], np.int64), [len(b) for b in batches])
        key = (attempts << 40) + np.concatenate([b.steps for b in batches]).astype(np.int64, copy=False)
        pos_all = self._grow(ranks)
        order = np.argsort(key, kind="stable")
        for f in TIMING_FIELDS:
            if not any(f in b.values for b in batches):
                continue
            v = np.concatenate([b.values[f] if f in b.values else np.full(len(b), np.nan) for b in batches])
            p = np.concatenate([b.present[f] if f in b.present else np.zeros(len(b), bool) for b in batches])
            col = self.values.setdefault(f, np.full(len(self.ids), np.nan))
            at = self.at.setdefault(f, np.full(len(self.ids), -1, np.int64))
            o = order[(p & np.isfinite(v))[order]]
            pos = pos_all[o]
            newer = key[o] >= at[pos]                       # not older than the table's
            o, pos = o[newer], pos[newer]
            col[pos], at[pos] = v[o], key[o]
        for batch in batches:
            if batch.host_index is not None:
                self._fold_hosts(batch)

    def _fold_hosts(self, batch: Any) -> None:
        """The host each rank reported last in ``batch`` (by step)."""
        steps, ranks = np.asarray(batch.steps, np.int64), np.asarray(batch.ranks, np.int64)
        order = np.lexsort((steps, ranks))
        last = order[np.r_[ranks[order][1:] != ranks[order][:-1], True]] if len(order) else order
        pos = np.searchsorted(self.ids, ranks[last])
        codes = np.array([self._host(h) for h in batch.host_names] + [-1], np.int32)  # distinct hosts only
        hi = batch.host_index[last]
        self.host_code[pos[hi >= 0]] = codes[hi[hi >= 0]]

    def _host(self, name: str) -> int:
        if name not in self.host_codes:
            self.host_codes[name] = len(self.host_names)
            self.host_names.append(name)
        return self.host_codes[name]

    def _grow(self, ranks: np.ndarray) -> np.ndarray:
        """Room for ``ranks`` in the table; their positions in it. (A live run's ranks are all
        known after its first steps: then this is one search, no set union of every record.)"""
        pos = np.searchsorted(self.ids, ranks)
        known = self.ids[np.minimum(pos, len(self.ids) - 1)] == ranks if len(self.ids) else np.zeros(len(ranks), bool)
        if known.all():
            return pos
        merged = np.union1d(self.ids, ranks[~known])
        where = np.searchsorted(merged, self.ids)
        for f, col in self.values.items():
            new, at = np.full(len(merged), np.nan), np.full(len(merged), -1, np.int64)
            new[where], at[where] = col, self.at[f]
            self.values[f], self.at[f] = new, at
        code = np.full(len(merged), -1, np.int32)
        code[where] = self.host_code
        self.ids, self.host_code = merged, code
        return np.searchsorted(self.ids, ranks)

    def host(self, rank: int) -> str | None:
        i = int(np.searchsorted(self.ids, rank))
        if i < len(self.ids) and self.ids[i] == rank and self.host_code[i] >= 0:
            return self.host_names[self.host_code[i]]
        return None


@dataclass(frozen=True)
class RankLine:
    """One exported rank: why it is there, its timing against its peers, its host."""
    rank: int
    host: str | None
    field: str | None          # the timing field ranked; None when the run reports none
    value: float | None        # the rank's newest value of ``field``, seconds
    ratio: float | None        # value / median of all ranks' newest values
    findings: int              # active findings that name the rank


class RankTimes:
    """The newest timing of every rank of each run (writer thread in, scrape thread out)."""

    def __init__(self) -> None:
        self._tables: dict[str, _RankTable] = {}
        self._pending: dict[str, list[Any]] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RankTimes(runs={len(self._tables)})"

    def add(self, pushes: list[tuple[Any, Any]]) -> None:
        """A group commit's new (result, batch) pairs (``feed.new_batches``)."""
        with self._lock:
            for r, batch in pushes:
                pending = self._pending.get(r.run_id)
                if pending is None:
                    pending = self._pending[r.run_id] = []
                pending.append((r.attempt, batch))
                held = self._held[r.run_id] = self._held.get(r.run_id, 0) + len(batch)
                if (held > FOLD_AT_RECORDS or len(pending) > FOLD_AT_PUSHES) and len(pending) > 1:
                    self._prune_or_fold(r.run_id, pending)

    def _prune_or_fold(self, run_id: str, pending: list[tuple[int, Any]]) -> None:
        """The run's pending pushes down to the newest alone when it supersedes the others (no
        fold: one push pending is as little as it gets, whatever its size), else folded (the
        lock held)."""
        kept = _newest_alone_if_it_supersedes(pending)
        if len(kept) == 1:
            self._pending[run_id], self._held[run_id] = kept, len(kept[0][1])
        else:
            self._fold(run_id, kept)

    def _fold(self, run_id: str, pending: list[tuple[int, Any]] | None = None) -> _RankTable:
        """The run's table with its pending batches folded in, oldest first (the lock held);
        ``pending``: those batches, already pruned where they could be."""
        table = self._tables.setdefault(run_id, _RankTable())
        queued = self._pending.pop(run_id, [])
        table.fold(_newest_alone_if_it_supersedes(queued) if pending is None else pending)
        self._held[run_id] = 0
        return table

    def top(self, run_id: str, k: int, named: Iterable[tuple[int, str | None]] = ()) -> list[RankLine]:
        """At most ``k`` ranks: those in ``named`` first ((rank, host) of active findings, most
        important first, repeats counted), then the slowest by ratio to the median."""
        counts: dict[int, int] = {}
        named_hosts: dict[int, str | None] = {}
        for rank, host in named:
            counts[int(rank)] = counts.get(int(rank), 0) + 1
            named_hosts.setdefault(int(rank), host)
        with self._lock:
            table = self._fold(run_id)
            f = next((f for f in TIMING_FIELDS if f in table.values and np.isfinite(table.values[f]).any()), None)
            chosen = list(counts)[:k]
            ratio = np.zeros(0)
            if f is not None:
                col = table.values[f]
                median = float(np.median(col[np.isfinite(col)]))
                ratio = col / median if median > 0 else np.full(len(col), np.nan)
                ranked = np.where(np.isfinite(ratio), ratio, -np.inf)
                want = min(k, len(ranked))
                cand = np.argpartition(-ranked, want - 1)[:want] if want else np.zeros(0, np.int64)
                cand = cand[np.argsort(-ranked[cand], kind="stable")]
                for i in cand:
                    if len(chosen) >= k:
                        break
                    if np.isfinite(ranked[i]) and int(table.ids[i]) not in counts:
                        chosen.append(int(table.ids[i]))
            out = []
            for rank in chosen:
                i = int(np.searchsorted(table.ids, rank))
                known = i < len(table.ids) and table.ids[i] == rank and f is not None
                value = float(table.values[f][i]) if known and f is not None else None
                out.append(RankLine(rank, table.host(rank) or named_hosts.get(rank), f,
                                    value if value is not None and np.isfinite(value) else None,
                                    float(ratio[i]) if known and np.isfinite(ratio[i]) else None,
                                    counts.get(rank, 0)))
            return out

    def forget(self, run_ids: Iterable[str]) -> None:
        """Let go of runs the store let go of (finished and quiet)."""
        with self._lock:
            for run_id in run_ids:
                self._tables.pop(run_id, None)
                self._pending.pop(run_id, None)
                self._held.pop(run_id, None)

    def keep_only(self, run_ids: set[str]) -> None:
        """Forget runs that are no longer exported (bounded memory)."""
        with self._lock:
            for run_id in (set(self._tables) | set(self._pending)) - run_ids:
                self._tables.pop(run_id, None)
                self._pending.pop(run_id, None)
                self._held.pop(run_id, None)


def _newest_alone_if_it_supersedes(pending: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """``pending`` as it is, or its newest push alone when folding that one leaves the table as
    folding all of them does (the usual fold of a job whose every push is a step of the same
    ranks: 256 pushes of 64 records were concatenated, sorted and scattered for the newest
    one's values): when it is :func:`_newer_and_fuller` than all the others and their ranks are
    all among its own (one search of their ranks, instead of a fold of them)."""
    if len(pending) < 2:
        return pending
    attempt, newest = pending[-1]
    older = pending[:-1]
    if not _newer_and_fuller(attempt, newest, older):
        return pending
    ranks = newest.ranks.tobytes()
    if all(b.ranks.tobytes() == ranks for _, b in older):   # the job's ranks again (the usual)
        return pending[-1:]
    own = np.unique(newest.ranks)
    theirs = np.concatenate([b.ranks for _, b in older])
    at = np.minimum(np.searchsorted(own, theirs), len(own) - 1)
    return pending[-1:] if len(own) and bool((own[at] == theirs).all()) else pending


def _newer_and_fuller(attempt: int, batch: Any, older: list[tuple[int, Any]]) -> bool:
    """Whether ``batch`` (of ``attempt``, arrived after ``older``'s (attempt, batch) pairs) leaves
    none of their values or hosts standing for the ranks it reports: every record of it is at
    least as new as every record of theirs by (attempt, step) (ties go to it, the later), every
    timing field they report it reports finite in every record, and if any of them names hosts,
    it names one in every record."""
    oldest_of_batch = (attempt << 40) + batch.step_bounds[0]
    if any((a << 40) + b.step_bounds[1] > oldest_of_batch for a, b in older):
        return False
    for f in TIMING_FIELDS:
        if any(f in b.values for _, b in older) and not (
                f in batch.values and f not in batch.partial_fields and np.isfinite(batch.values[f]).all()):
            return False
    return not any(b.host_index is not None for _, b in older) or (
        batch.host_index is not None and bool((batch.host_index >= 0).all()))


def named_ranks(active: list[Any]) -> list[tuple[int, str | None]]:
    """(rank, host) blamed by active stored findings, the worst severity first."""
    ordered = sorted(active, key=lambda sf: -SEVERITY_ORDER[sf.finding.severity])
    return [(int(r), h) for sf in ordered for r, h in zip_longest(sf.finding.ranks, sf.hosts[:len(sf.finding.ranks)])]
