"""Who else writes the runs this store writes: the store's one seam for replicas.

The store knows nothing of leases or owners (``healthsvc.ownership``, above it). What it must
know is whether other processes write the same runs into the same database, because then what
this process holds in memory of a run (its attempt, its ranks, its finished ranks) is only what
it was sent, and a few decisions read the database instead. Those decisions are this module's,
one method each, so the ingest and the control writes hold no mode of their own:

- :class:`SoleWriter`: one process on a SQLite file; its own state is the whole story.
- :class:`SharedWriters`: replicas on one PostgreSQL database.

Each store class says which it is (``StoreBase.sharing``); the ingest and the control writes
are built with it.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from healthsvc.store.batch import MetricBatch
from healthsvc.store.runstate import RunState


class DatabaseSharing(Protocol):
    def newer_attempt(self, conn: Any, run_id: str, attempt: int) -> tuple[int, int] | None:
        """(attempt, start step) of a restart another process opened after ``attempt``, or None."""
        ...

    def ranks_met(self, conn: Any, run_id: str, attempt: int, st: RunState, batch: MetricBatch,
                  new_attempt: bool, late: bool) -> None:
        """Record, in the batch's job, the ranks this process meets first in the attempt (and
        those it sees resume), for a finish counted across processes."""
        ...

    def restart_reopens(self, st: RunState, new_attempt: bool) -> bool:
        """Whether a batch opening a new attempt sets the run running again although this
        process did not see it finish (another may have taken the finish)."""
        ...

    def rank_finished(self, conn: Any, run_id: str, st: RunState, rank: int) -> bool:
        """Record ``rank``'s finish in the state (and the database, where others count it) and
        say whether every rank the attempt has seen has finished."""
        ...


class SoleWriter:
    """One process writes the database: the run states in its memory are the runs' whole story."""

    def newer_attempt(self, conn: Any, run_id: str, attempt: int) -> tuple[int, int] | None:
        return None   # every restart was opened here, so the state knows it

    def ranks_met(self, conn: Any, run_id: str, attempt: int, st: RunState, batch: MetricBatch,
                  new_attempt: bool, late: bool) -> None:
        pass   # the state counts them (rank_finished)

    def restart_reopens(self, st: RunState, new_attempt: bool) -> bool:
        return False   # a finish would have been taken here: st.finished says it

    def rank_finished(self, conn: Any, run_id: str, st: RunState, rank: int) -> bool:
        st.finished_ranks.add(rank)
        return set(st.ranks_seen().tolist()) <= st.finished_ranks


class SharedWriters:
    """Replicas write the same runs into one database (PostgreSQL): each sees only the pushes
    and finishes it was sent, so restarts and finishes are read from the database."""

    def newer_attempt(self, conn: Any, run_id: str, attempt: int) -> tuple[int, int] | None:
        """A replica that never saw a rank's old steps cannot tell that rank's repeated step from
        progress, so the run's newest attempt is read before every batch (one indexed row). With
        incarnations, a restarted rank's push opens (or joins) the attempt on its own; a push
        without one that commits here while the restart's first push is still uncommitted
        elsewhere can land in the old attempt: the one window this leaves."""
        row = conn.execute("SELECT attempt, start_step FROM attempts WHERE run_id=? AND attempt>? "
                           "ORDER BY attempt DESC LIMIT 1", (run_id, attempt)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def ranks_met(self, conn: Any, run_id: str, attempt: int, st: RunState, batch: MetricBatch,
                  new_attempt: bool, late: bool) -> None:
        # (A rank that finished through another replica and resumes here is not seen as
        # resumed: it stays finished in rank_progress until this attempt ends.)
        fresh = np.unique(batch.ranks) if new_attempt else st.unseen_ranks(batch)
        resumed = sorted(st.finished_ranks & set(batch.ranks.tolist())) if st.finished_ranks and not late else []
        if len(fresh) or resumed:
            conn.executemany("INSERT OR IGNORE INTO rank_progress VALUES (?, ?, ?, 0)",
                             [(run_id, attempt, int(r)) for r in fresh])
            conn.executemany("UPDATE rank_progress SET finished=0 WHERE run_id=? AND attempt=? AND rank=?",
                             [(run_id, attempt, int(r)) for r in resumed])

    def restart_reopens(self, st: RunState, new_attempt: bool) -> bool:
        # Another replica may have taken the finish, unknown here: a restart (a new attempt
        # after the first) is the run running again wherever it is heard first.
        return bool(new_attempt and st.attempt)

    def rank_finished(self, conn: Any, run_id: str, st: RunState, rank: int) -> bool:
        """Each replica sees only the finishes and ranks it was sent, so its own counts would
        call a run finished early (its ranks are done, others still train) or never: the
        finishes are counted in ``rank_progress``. The run's row is locked first: two replicas
        taking the last finishes at once must not each miss the other's."""
        conn.execute("SELECT status FROM runs WHERE run_id=? FOR UPDATE", (run_id,)).fetchone()
        joined = self.newer_attempt(conn, run_id, st.attempt) if st.attempt else None
        if joined is not None:
            st.join_attempt(*joined)
        attempt = max(st.attempt, 1)
        conn.execute("INSERT OR REPLACE INTO rank_progress VALUES (?, ?, ?, 1)", (run_id, attempt, rank))
        (left,) = conn.execute("SELECT count(*) FROM rank_progress WHERE run_id=? AND attempt=? AND finished=0",
                               (run_id, attempt)).fetchone()
        st.finished_ranks.add(rank)
        return left == 0
