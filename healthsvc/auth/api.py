"""``/v1/tokens`` (create, list, revoke) and ``/v1/audit`` (the admin action log); admin only."""
from __future__ import annotations

import re
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from healthsvc.auth.tokens import LAST_ADMIN, NOT_LIVE
from healthsvc.errors import Conflict, InvalidInput, NotFound
from healthsvc.schemas import ErrorBody

router = APIRouter(prefix="/v1", tags=["access"])

Scope = Literal["ingest", "read", "admin"]
_PREFIX = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=200, description="Who or what uses it (shown in the audit log).")
    scopes: list[Scope] = Field(..., min_length=1, max_length=3,
                                description="ingest (push metrics, checkpoints, heartbeats, events, finish), read "
                                            "(every GET), admin (everything, tokens included).")
    run_prefix: str | None = Field(None, description="ingest only to runs whose id starts with this.")


class TokenOut(BaseModel):
    id: str = Field(..., description="Identifier (for DELETE /v1/tokens/{id}); not the secret.")
    name: str = Field(..., description="Who or what uses it.")
    scopes: list[str] = Field(..., description="Granted scopes.")
    run_prefix: str | None = Field(None, description="ingest limited to runs starting with this.")
    created_at: float = Field(..., description="Unix seconds.")
    created_by: str = Field(..., description="Who created it.")
    revoked_at: float | None = Field(None, description="Unix seconds; null while valid.")


class TokenCreated(TokenOut):
    token: str = Field(..., description="The secret, shown only in this answer: send it as Authorization: Bearer.")


class AuditEntry(BaseModel):
    id: int = Field(..., description="Increasing.")
    at: float = Field(..., description="When, unix seconds (service clock).")
    actor: str = Field(..., description="Who: the token's name and id, or anonymous on an open service.")
    method: str = Field(..., description="What: the HTTP method ...")
    path: str = Field(..., description="... and path.")
    status: int = Field(..., description="The answer's HTTP status.")


def _tokens(request: Request):
    return request.app.state.tokens


def _actor(request: Request) -> str:
    tok = request.scope.get("state", {}).get("token")
    return tok.actor if tok is not None else "anonymous (open service)"


@router.post("/tokens", status_code=201, response_model=TokenCreated, summary="Create a token (its secret is shown once)")
def create_token(body: TokenIn, request: Request) -> dict:
    tokens = _tokens(request)
    if body.run_prefix is not None and not _PREFIX.match(body.run_prefix):
        raise InvalidInput("run_prefix must be 1-128 run-id characters", loc=("body", "run_prefix"))
    if not tokens.enabled and "admin" not in body.scopes:
        raise InvalidInput("the first token must have the admin scope (it switches access control on; without "
                           "an admin nobody could manage tokens afterwards)", loc=("body", "scopes"))
    secret, tok = tokens.create(body.name, list(body.scopes), body.run_prefix, _actor(request))
    return {**tok.to_dict(), "token": secret}


@router.get("/tokens", response_model=list[TokenOut], summary="Tokens (never their secrets), revoked ones included")
def list_tokens(request: Request) -> list[dict]:
    return [t.to_dict() for t in _tokens(request).list()]


@router.delete("/tokens/{token_id}", response_model=TokenOut, summary="Revoke a token (at once, on every replica)",
               responses={404: {"model": ErrorBody, "description": "No live token with this id."},
                          409: {"model": ErrorBody, "description": "The last admin token of a service listening "
                                                                   "beyond loopback: create another admin token first."}})
def revoke_token(request: Request, token_id: Annotated[str, Path(max_length=64, description="The token's id.")]) -> dict:
    tokens = _tokens(request)
    outcome = tokens.revoke(token_id)
    if outcome == NOT_LIVE:
        raise NotFound(f"no live token {token_id!r}", loc=("path", "token_id"))
    if outcome == LAST_ADMIN:
        host = request.app.state.settings.host
        raise Conflict(f"token {token_id!r} is the last admin token, and this service listens on {host} (beyond "
                       "loopback): revoking it would open the service to anyone who can reach it",
                       loc=("path", "token_id"),
                       hint='create another admin token first (POST /v1/tokens with "scopes": ["admin"]), '
                            "then revoke this one; or set HEALTHSVC_ADMIN_TOKEN")
    return next(t.to_dict() for t in tokens.list() if t.id == token_id)


@router.get("/audit", response_model=list[AuditEntry], summary="Admin actions: who did what, when (newest first)")
def audit(request: Request, limit: Annotated[int, Query(ge=1, le=100_000, description="At most this many.")] = 1000) -> list[dict]:
    return _tokens(request).audit(limit)
