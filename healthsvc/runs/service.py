"""Runs at a glance: the summary behind ``GET /v1/runs`` and ``GET /v1/runs/{run_id}``.

Features add sections to a run's summary (findings, timeline, ...) by registering a contributor
``fn(run_id) -> dict`` on :class:`RunSummaries`; a failing contributor is logged and skipped so
one broken section never hides a run.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from pydantic import ValidationError

from healthsvc.errors import NotFound
from healthsvc.schemas import RunConfig, upgrade_stored_config
from healthsvc.store.interface import Store

log = logging.getLogger(__name__)

Contributor = Callable[[str], dict[str, Any]]


class RunSummaries:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.contributors: list[Contributor] = []

    def add_contributor(self, fn: Contributor) -> None:
        self.contributors.append(fn)

    def summary(self, run_id: str, *, detail: bool = True) -> dict[str, Any]:
        row = self.store.reads.get_run_row(run_id)
        if row is None:
            raise NotFound(f"run {run_id!r} does not exist", loc=("path", "run_id"),
                           hint="runs are created by their first push or by PUT /v1/runs/{run_id}")
        return self._summarise(row, detail)

    def list(self) -> list[dict[str, Any]]:
        return [self._summarise(row, detail=False) for row in self.store.reads.list_run_rows()]

    def _summarise(self, row: dict, detail: bool) -> dict[str, Any]:
        run_id = row["run_id"]
        st = self.store.reads.run_view(run_id)
        ranks_seen = st.ranks_seen if st else 0
        config, config_error = shown_config(row["config"])
        out = {
            "run_id": run_id, "status": row["status"], "created_at": row["created_at"],
            "last_push": st.last_push if st else None, "finished_at": row["finished_at"],
            "attempt": st.attempt if st else 0,
            "last_step": (st.max_step if st and st.max_step >= 0 else None),
            "world_size": config.get("world_size") or (ranks_seen or None),
            "ranks_seen": ranks_seen, "config": config, "config_error": config_error,
        }
        if detail:
            out["attempts"] = self.store.reads.attempts(run_id)
        for fn in self.contributors:
            try:
                section = fn(run_id) if detail else {}
                if section.get("config_error", "") is None:
                    section = {k: v for k, v in section.items() if k != "config_error"}
                out.update(section)
            except Exception:
                log.exception("run summary contributor %r failed for run %s", fn, run_id)
        return out


def shown_config(config: object) -> tuple[dict[str, Any], str | None]:
    """The stored config as the schema describes it, and why not when it no longer validates (a
    config written by an older version, or by hand, must not make every listing a 500)."""
    try:
        return RunConfig.model_validate(upgrade_stored_config(config)).model_dump(), None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        # model_validate({}) is RunConfig(): mypy does not take Field(None, ...) for a default.
        default = RunConfig.model_validate({}).model_dump()
        return default, f"stored config does not validate: {where}: {err.get('msg')}"
