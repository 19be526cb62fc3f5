"""Errors the service raises on purpose, each mapped to an HTTP status by the app.

    HealthsvcError
    ├── BadRequest          400  the body is not JSON / not valid gzip
    ├── PayloadTooLarge     413  the body is over the configured limit
    ├── InvalidInput        422  the JSON is well formed but a field is wrong (names the field)
    ├── NotFound            404  no such run / checkpoint / resource
    ├── Conflict            409  the request contradicts stored state
    ├── TooManyRequests     429  a quota of the service is reached (runs)
    ├── StoreUnavailable    503  the store refused the write (I/O error, locked, constraint)
    └── InsufficientStorage 507  the disk is full
"""
from __future__ import annotations

from typing import Any


class HealthsvcError(Exception):
    status_code = 500
    error_type = "internal"

    def __init__(self, message: str, *, loc: tuple[Any, ...] = (), hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.hint = hint

    def detail(self) -> list[dict[str, Any]]:
        """FastAPI-shaped error detail, so clients parse one shape for every 4xx."""
        item: dict[str, Any] = {"loc": list(self.loc), "msg": self.message, "type": self.error_type}
        if self.hint:
            item["hint"] = self.hint
        return [item]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, loc={self.loc!r})"


class BadRequest(HealthsvcError):
    status_code = 400
    error_type = "bad_request"


class PayloadTooLarge(HealthsvcError):
    status_code = 413
    error_type = "payload_too_large"


class InvalidInput(HealthsvcError):
    status_code = 422
    error_type = "invalid_input"


class NotFound(HealthsvcError):
    status_code = 404
    error_type = "not_found"


class Conflict(HealthsvcError):
    status_code = 409
    error_type = "conflict"


class TooManyRequests(HealthsvcError):
    status_code = 429
    error_type = "quota_exceeded"


class StoreUnavailable(HealthsvcError):
    status_code = 503
    error_type = "store_unavailable"


class InsufficientStorage(HealthsvcError):
    status_code = 507
    error_type = "insufficient_storage"


def quota_error(exc: Any) -> HealthsvcError:
    """What a client is told when a write would cross a store quota
    (:class:`healthsvc.store.quotas.QuotaExceeded`): 429 for one run too many (the request was
    right; the service is full), 422 for a push with too many metric names (naming its body)."""
    hint = f"raise HEALTHSVC_{exc.setting.upper()} if this is expected (now {exc.limit})"
    if exc.setting in ("max_runs", "max_runs_per_token"):
        return TooManyRequests(str(exc), loc=("path", "run_id"), hint=hint + "; or push to an existing run")
    return InvalidInput(str(exc), loc=("body",), hint=hint + "; or send such values as fewer metrics")


def store_error(exc: BaseException) -> HealthsvcError:
    """What a client is told when the store fails a write: 507 for a full disk, else 503. Nothing
    of the request was stored (its transaction rolled back), so a retry is safe."""
    text = str(exc)
    hint = "nothing was stored; retry later (GET /readyz says when writes work again)"
    if "full" in text.lower() or getattr(exc, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
        return InsufficientStorage(f"the store is full: {text}", loc=(), hint=hint)
    return StoreUnavailable(f"the store could not write: {type(exc).__name__}: {text}"[:300], loc=(), hint=hint)
