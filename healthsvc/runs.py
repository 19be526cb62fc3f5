"""Runs at a glance: the summary behind ``GET /v1/runs`` and ``GET /v1/runs/{run_id}``.

Features add sections to a run's summary (findings, timeline, ...) by registering a contributor
``fn(run_id) -> dict`` on :class:`RunSummaries`; a failing contributor is logged and skipped so
one broken section never hides a run.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from healthsvc.errors import NotFound
from healthsvc.store.sqlite import SQLiteStore

log = logging.getLogger(__name__)

Contributor = Callable[[str], dict[str, Any]]


class RunSummaries:
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.contributors: list[Contributor] = []

    def add_contributor(self, fn: Contributor) -> None:
        self.contributors.append(fn)

    def summary(self, run_id: str, *, detail: bool = True) -> dict[str, Any]:
        row = self.store.get_run_row(run_id)
        if row is None:
            raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"),
                           hint="runs are created by their first push or by PUT /v1/runs/{run_id}")
        return self._summarise(row, detail)

    def list(self) -> list[dict[str, Any]]:
        return [self._summarise(row, detail=False) for row in self.store.list_run_rows()]

    def _summarise(self, row: dict, detail: bool) -> dict[str, Any]:
        run_id = row["run_id"]
        st = self.store.run_state(run_id)
        ranks_seen = int(len(st.ranks_seen())) if st else 0
        out = {
            "run_id": run_id, "status": row["status"], "created_at": row["created_at"],
            "last_push": st.last_push if st else None, "finished_at": row["finished_at"],
            "attempt": st.attempt if st else 0,
            "last_step": (st.max_step() if st and st.max_step() >= 0 else None),
            "world_size": row["config"].get("world_size") or (ranks_seen or None),
            "ranks_seen": ranks_seen, "config": row["config"],
        }
        if detail:
            out["attempts"] = self.store.attempts(run_id)
        for fn in self.contributors:
            try:
                out.update(fn(run_id) if detail else {})
            except Exception:
                log.exception("run summary contributor %r failed for run %s", fn, run_id)
        return out
