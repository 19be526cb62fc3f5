"""A bounded top-k of per-rank series: the ranks worth a line in Grafana, at most k per run.

A run has up to 16,384 ranks; a series per rank would be 16,384 series per run per field. So only
``metrics_top_ranks`` ranks per run (default 8) are exported: first the ranks named by the run's
active findings (the on-call engineer's suspects, worst severity first), then the slowest ranks
by the ratio of their newest timing to the median of all ranks' newest: ``compute_time`` when
the run reports it (in synchronous training every rank waits at the collective, so ``step_time``
is nearly equal on all ranks and ``compute_time`` shows the straggler), else ``step_time``.
A ratio of 2.0 is "twice as slow as its peers", whatever the job's own speed.

Each push is folded into its run's table as it is committed (on the writer thread): for each
timing field a masked copy (a step of every rank the table knows, in rank order: the usual push)
or a search and a scatter, 10 to 20 microseconds a push. Nothing is held between pushes: pushes
used to be kept and folded in bulk when a scrape asked, which pinned every column of their
batches (up to 65,536 records a run) and needed a rule for a push replacing the one before it;
measured in process (bench/ingest_inproc.py), folding at once costs the same.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any, Iterable

import numpy as np

from healthsvc_detectors.finding import SEVERITY_ORDER
from healthsvc.run_metrics.feed import new_batches

TIMING_FIELDS = ("compute_time", "step_time")   # the first one a run reports is the one ranked


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
        """(attempt, batch) pairs, oldest first (one push as it is committed, or many: a table
        rebuilt), in one pass: their records are concatenated and sorted once (no sort when they
        are in order already, nearly always). For each field, a rank's newest reported finite
        value wins.

        The sort is by (attempt, step) alone, stable, and the values are then written in that
        order: of a rank's records the newest is written last and stays (numpy assigns repeated
        indices in order), ties going to the later arrival. Pushes come nearly in step order,
        so the sort is close to linear (a sort by rank first, as a lexsort, was the fold's cost)."""
        if not pending:
            return
        if len(pending) == 1:   # a push as it is committed: its own columns, no copies
            (attempt, only), = pending
            ranks = np.asarray(only.ranks, np.int64)
            key = (np.int64(attempt) << 40) + np.asarray(only.steps, np.int64)
        else:
            ranks = np.concatenate([np.asarray(b.ranks, np.int64) for _, b in pending])
            key = np.concatenate([(np.int64(a) << 40) + np.asarray(b.steps, np.int64) for a, b in pending])
        # The usual push is a step of every rank the table knows, in rank order: then record i
        # is the table's row i, and each field is one masked copy (no positions, no gathers).
        same = len(ranks) == len(self.ids) and bool((ranks == self.ids).all())
        pos_all = None if same else self._grow(ranks)
        # Pushes come in step order: their keys are nearly always sorted already (one step, or
        # several in order), and then the order is the records' own.
        in_order = len(key) < 2 or bool((key[1:] >= key[:-1]).all())
        order = None if in_order else np.argsort(key, kind="stable")
        for f in TIMING_FIELDS:
            if not any(f in b.values for _, b in pending):
                continue
            if len(pending) == 1:
                v, p = pending[0][1].values[f], pending[0][1].present[f]
            else:
                v = np.concatenate([b.values[f] if f in b.values else np.full(len(b), np.nan) for _, b in pending])
                p = np.concatenate([b.present[f] if f in b.present else np.zeros(len(b), bool) for _, b in pending])
            if f not in self.values:
                self.values[f], self.at[f] = np.full(len(self.ids), np.nan), np.full(len(self.ids), -1, np.int64)
            col, at = self.values[f], self.at[f]
            ok = p & np.isfinite(v)
            if pos_all is None:   # each rank once, at its own row (order needs no sort then)
                ok &= key >= at                             # not older than the table's
                np.copyto(col, v, where=ok)
                np.copyto(at, key, where=ok)
                continue
            o = ok.nonzero()[0] if order is None else order[ok[order]]
            pos = pos_all[o]
            newer = key[o] >= at[pos]                       # not older than the table's
            o, pos = o[newer], pos[newer]
            col[pos], at[pos] = v[o], key[o]
        for _, batch in pending:
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
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RankTimes(runs={len(self._tables)})"

    def on_store_results(self, results: list[Any]) -> None:
        for r, batch in new_batches(results):
            if not any(f in batch.values for f in TIMING_FIELDS) and batch.host_index is None:
                continue   # nothing the table holds
            with self._lock:
                table = self._tables.get(r.run_id)
                if table is None:
                    table = self._tables[r.run_id] = _RankTable()
                table.fold([(r.attempt, batch)])

    def top(self, run_id: str, k: int, named: Iterable[tuple[int, str | None]] = ()) -> list[RankLine]:
        """At most ``k`` ranks: those in ``named`` first ((rank, host) of active findings, most
        important first, repeats counted), then the slowest by ratio to the median."""
        counts: dict[int, int] = {}
        named_hosts: dict[int, str | None] = {}
        for rank, host in named:
            counts[int(rank)] = counts.get(int(rank), 0) + 1
            named_hosts.setdefault(int(rank), host)
        with self._lock:
            table = self._tables.get(run_id) or _RankTable()
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

    def keep_only(self, run_ids: set[str]) -> None:
        """Forget runs that are no longer exported (bounded memory)."""
        with self._lock:
            for run_id in set(self._tables) - run_ids:
                del self._tables[run_id]


def named_ranks(active: list[Any]) -> list[tuple[int, str | None]]:
    """(rank, host) blamed by active stored findings, the worst severity first."""
    ordered = sorted(active, key=lambda sf: -SEVERITY_ORDER[sf.finding.severity])
    return [(int(r), h) for sf in ordered for r, h in zip_longest(sf.finding.ranks, sf.hosts[:len(sf.finding.ranks)])]
