"""Dependency aliases for the routers, in one place."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from healthsvc.observability import ServiceMetrics
from healthsvc.runs import RunSummaries
from healthsvc.settings import Settings
from healthsvc.store.interface import Store

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


async def _store(request: Request) -> Store:
    return request.app.state.store


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


async def _summaries(request: Request) -> RunSummaries:
    return request.app.state.summaries


StoreDep = Annotated[Store, Depends(_store)]
SettingsDep = Annotated[Settings, Depends(_settings)]
MetricsDep = Annotated[ServiceMetrics, Depends(_metrics)]
SummariesDep = Annotated[RunSummaries, Depends(_summaries)]
RunId = Annotated[str, Path(pattern=RUN_ID_PATTERN, description="Run identifier: letters, digits, '.', '_', ':', '-' (1-128).")]
