"""Request authentication and role checks, as FastAPI dependencies.

Order of checks: a ``Authorization: Bearer`` header names an API token (scripts; no CSRF
needed since browsers never attach it on their own); otherwise the session cookie names a
browser session, and every unsafe method must repeat the session's CSRF token in the
``X-CSRF-Token`` header (double submit). A robot's credential is refused with 403.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from dashboard import accounts
from dashboard.accounts import Principal
from dashboard.security import csrf_token, same
from foundation.store.accounts import Role, TokenKind
from foundation.store.metadata_store import MetadataStore

SESSION_COOKIE = "robofleet_session"
CSRF_COOKIE = "robofleet_csrf"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def store_of(request: Request) -> MetadataStore:
    store: MetadataStore = request.app.state.store
    return store


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def authenticate(request: Request) -> Principal:
    """The caller, or HTTPException 401 (no/unknown credential) / 403 (robot, CSRF)."""
    store = store_of(request)
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized("Authorization must be 'Bearer <API token>'")
        principal = accounts.resolve(store, token, TokenKind.API)
        if principal is not None:
            return principal
        if store.robot_for_credential(token) is not None:
            raise HTTPException(403, "robot credentials cannot call the dashboard API")
        raise _unauthorized("unknown, expired or revoked API token")
    session = request.cookies.get(SESSION_COOKIE)
    if not session:
        raise _unauthorized("not logged in")
    principal = accounts.resolve(store, session, TokenKind.SESSION)
    if principal is None:
        raise _unauthorized("session expired or logged out; log in again")
    if request.method not in SAFE_METHODS:
        sent = request.headers.get(CSRF_HEADER, "")
        if not sent or not same(sent, csrf_token(request.app.state.secret, session)):
            raise HTTPException(403, f"missing or wrong CSRF token (send the {CSRF_HEADER} header)")
    return principal


def require(role: Role) -> Callable[[Request], Principal]:
    """Dependency: an authenticated caller whose role is at least ``role``."""

    def dependency(request: Request) -> Principal:
        principal = authenticate(request)
        if principal.role.rank < role.rank:
            raise HTTPException(
                403, f"this action needs the {role.value} role (you are {principal.role.value})"
            )
        request.state.principal = principal
        return principal

    dependency.min_role = role  # type: ignore[attr-defined]
    dependency.__name__ = f"require_{role.value}"
    return dependency


require_viewer = require(Role.VIEWER)
require_operator = require(Role.OPERATOR)
require_admin = require(Role.ADMIN)

# Route parameter types: ``def route(principal: Operator, ...)``.
Viewer = Annotated[Principal, Depends(require_viewer)]
Operator = Annotated[Principal, Depends(require_operator)]
Admin = Annotated[Principal, Depends(require_admin)]
