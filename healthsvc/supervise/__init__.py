"""Closing the loop: the service decides what a supervisor does with a run (a feature).

Adds ``GET /v1/runs/{run_id}/action`` (continue, restart from which checkpoint without which
hosts, or stop, with a named reason; the policy is :mod:`healthsvc.supervise.policy`, configured
per run by ``PUT /v1/runs/{run}`` ``{"supervise": {...}}``) and the ``healthsvc supervise``
command (``healthsvc.supervise.cli``, standard library only), which runs a training under it. See
docs/supervise.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from healthsvc.context import ServiceContext


if TYPE_CHECKING:  # the client-only install runs ``healthsvc supervise`` without FastAPI
    from fastapi import FastAPI


def install(app: FastAPI, ctx: ServiceContext) -> None:
    from healthsvc.supervise.api import router

    app.include_router(router)
