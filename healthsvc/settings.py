"""Service settings: defaults, then ``HEALTHSVC_*`` environment variables, then CLI flags.

Nothing is read at import time: :func:`healthsvc.app.create_app` takes a :class:`Settings`.
"""
from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEALTHSVC_", extra="ignore")

    db: str = Field("sqlite:///healthsvc.db",
                    description="Store URI: sqlite:///relative.db, sqlite:////absolute.db or a plain path.")
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on (0 = any free port).")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024,
                                description="Largest accepted request body, before and after gzip, bytes.")
    snapshot_every_s: float = Field(5.0, gt=0, description="How often run state is snapshotted, seconds.")
    external_url: str = Field("", description="Public base URL of the service, for links in alerts.")
    log_level: str = Field("info", description="Log level: debug, info, warning, error.")
    access_log: bool = Field(False, description="Log every request (off: ingest is high-rate).")
