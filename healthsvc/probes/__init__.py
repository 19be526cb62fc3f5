"""Replay probes (a feature of the service): tell a suspect rank's hardware from its data.

Adds ``POST /v1/runs/{run_id}/probes`` (ask for a probe of a suspect rank), ``GET
/v1/runs/{run_id}/probes/next`` (what the trainer polls), ``POST
/v1/runs/{run_id}/probes/{probe_id}/reports`` (each rank's recomputed gradient norm), ``GET
/v1/runs/{run_id}/probes[/{probe_id}]``; the probes are the store's (``healthsvc.store.probes``). The trainer's side is
``healthsvc_client.probe``; the verdict is :func:`healthsvc_detectors.offline.replay.judge_replay`'s. The service asks for
a probe itself when a warning or critical ``replica_mismatch``, ``rank_outlier`` or per-rank spike
names a rank that has none pending.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


if TYPE_CHECKING:
    from fastapi import FastAPI


def install(app: FastAPI, ctx: ServiceContext) -> None:
    from healthsvc.probes.api import router
    from healthsvc.probes.service import auto_probe_listener

    app.include_router(router)
    ctx.auto_probe = auto_probe_listener(ctx)   # a stage of the pipeline (healthsvc.pipeline)
