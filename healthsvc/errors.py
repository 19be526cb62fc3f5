"""Errors the service raises on purpose, each mapped to an HTTP status by the app.

    HealthsvcError
    ├── BadRequest          400  the body is not JSON / not valid gzip
    ├── PayloadTooLarge     413  the body is over the configured limit
    ├── InvalidInput        422  the JSON is well formed but a field is wrong (names the field)
    ├── NotFound            404  no such run / checkpoint / resource
    └── Conflict            409  the request contradicts stored state
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
