"""Findings (a feature): what the detectors found, stored once, queried by ``GET
/v1/runs/{run_id}/findings`` (``api``) and by run health, rollback and economics (``service``)."""
from healthsvc.findings.service import FindingsRecorded, FindingsService, StoredFinding

__all__ = ["FindingsRecorded", "FindingsService", "StoredFinding"]
