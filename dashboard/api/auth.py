"""Log-in, log-out, who am I, password, API tokens, and user management."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from sqlalchemy import func, select

from dashboard import accounts
from dashboard.accounts import AccountError
from dashboard.api.common import (
    AUTH_ERRORS,
    CONFLICT,
    NOT_FOUND,
    all_rows,
    field_error,
    get_or_404,
    not_found,
)
from dashboard.deps import CSRF_COOKIE, SESSION_COOKIE, Admin, Viewer, store_of
from dashboard.schemas import (
    ApiTokenCreate,
    ApiTokenCreated,
    ApiTokenOut,
    LoginRequest,
    Me,
    PasswordChange,
    UserCreate,
    UserOut,
    UserUpdate,
)
from dashboard.security import csrf_token, hash_password
from foundation.store.accounts import ApiToken, Role, TokenKind, User
from foundation.store.models import utcnow

router = APIRouter(tags=["auth"])


def _check_new_password(password: str) -> None:
    """Raises a 422 on ``password`` when the accounts policy refuses it."""
    try:
        accounts.check_password_strength(password)
    except AccountError as err:
        raise field_error([("password", str(err))]) from None


@router.post(
    "/auth/login",
    response_model=Me,
    summary="Log in; sets the session and CSRF cookies",
    responses={
        401: {"description": "wrong username or password"},
        429: {"description": "too many failed logins from this client; see Retry-After"},
    },
)
def login(body: LoginRequest, request: Request, response: Response) -> Me:
    settings = request.app.state.settings.dashboard
    throttle = request.app.state.login_throttle
    client = request.client.host if request.client else "unknown"
    wait = throttle.retry_after(client, body.username)
    if wait is not None:
        store_of(request).record_event(
            "user.login_throttled", actor="anonymous", username=body.username, client=client
        )
        raise HTTPException(
            429,
            f"too many failed logins from {client}; try again in {wait:.0f} s",
            headers={"Retry-After": str(max(1, round(wait)))},
        )
    token = accounts.login(store_of(request), body.username, body.password, settings.session_ttl_s)
    if token is None:
        throttle.failed(client, body.username)
        raise HTTPException(401, "wrong username or password")
    throttle.succeeded(client, body.username)
    csrf = csrf_token(request.app.state.secret, token)
    max_age = int(settings.session_ttl_s)
    secure = settings.cookie_secure
    response.set_cookie(
        SESSION_COOKIE, token, max_age=max_age, httponly=True, samesite="strict", secure=secure
    )
    # Readable by the page's script, which echoes it in X-CSRF-Token.
    response.set_cookie(CSRF_COOKIE, csrf, max_age=max_age, samesite="strict", secure=secure)
    principal = accounts.resolve(store_of(request), token, TokenKind.SESSION)
    assert principal is not None
    return Me(username=principal.username, role=principal.role, via="session", csrf_token=csrf)


@router.post(
    "/auth/logout", response_model=Me, summary="End this browser session", responses=AUTH_ERRORS
)
def logout(principal: Viewer, request: Request, response: Response) -> Me:
    accounts.revoke_token(
        store_of(request), principal.token_id, actor=principal.actor, reason="logout"
    )
    response.delete_cookie(SESSION_COOKIE)
    response.delete_cookie(CSRF_COOKIE)
    return Me(username=principal.username, role=principal.role, via=principal.via.value)


@router.get("/auth/me", response_model=Me, summary="Who is calling", responses=AUTH_ERRORS)
def me(principal: Viewer, request: Request) -> Me:
    csrf = None
    if principal.via == TokenKind.SESSION:
        csrf = csrf_token(request.app.state.secret, request.cookies.get(SESSION_COOKIE, ""))
    return Me(
        username=principal.username, role=principal.role, via=principal.via.value, csrf_token=csrf
    )


@router.post(
    "/auth/password",
    response_model=Me,
    summary="Change your own password",
    responses={**AUTH_ERRORS, 422: {"description": "current password wrong or new one too short"}},
)
def change_password(body: PasswordChange, principal: Viewer, request: Request) -> Me:
    try:
        accounts.change_password(
            store_of(request), principal.user_id, body.current_password, body.new_password
        )
    except AccountError as err:
        field = "current_password" if "current" in str(err) else "new_password"
        raise field_error([(field, str(err))]) from None
    return Me(username=principal.username, role=principal.role, via=principal.via.value)


# -- API tokens (each person manages their own) ------------------------------------------------


@router.get(
    "/tokens", response_model=list[ApiTokenOut], summary="Your API tokens", responses=AUTH_ERRORS
)
def list_tokens(principal: Viewer, request: Request) -> list[ApiToken]:
    mine = (ApiToken.user_id == principal.user_id) & (ApiToken.kind == TokenKind.API)
    return all_rows(request, select(ApiToken).where(mine).order_by(ApiToken.id))


@router.post(
    "/tokens",
    response_model=ApiTokenCreated,
    status_code=201,
    summary="Create an API token for scripts (it carries your role)",
    responses=AUTH_ERRORS,
)
def create_token(body: ApiTokenCreate, principal: Viewer, request: Request) -> ApiTokenCreated:
    ttl = None if body.ttl_days is None else body.ttl_days * 86400
    tok, token = accounts.create_api_token(
        store_of(request), principal.user_id, body.name, ttl, actor=principal.actor
    )
    return ApiTokenCreated(**ApiTokenOut.model_validate(tok).model_dump(), token=token)


@router.delete(
    "/tokens/{token_id}",
    response_model=ApiTokenOut,
    summary="Revoke one of your API tokens",
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def revoke_token(token_id: int, principal: Viewer, request: Request) -> ApiToken:
    store = store_of(request)
    with store.session() as s:
        tok = s.get(ApiToken, token_id)
        if tok is None or tok.user_id != principal.user_id or tok.kind != TokenKind.API:
            raise not_found("API token", token_id)
    accounts.revoke_token(store, token_id, actor=principal.actor, reason="revoked by owner")
    with store.session() as s:
        return get_or_404(s, ApiToken, token_id, "API token")


# -- users (admin) ----------------------------------------------------------------------------


@router.get("/users", response_model=list[UserOut], summary="All users", responses=AUTH_ERRORS)
def list_users(_: Admin, request: Request) -> list[User]:
    return all_rows(request, select(User).order_by(User.id))


@router.post(
    "/users",
    response_model=UserOut,
    status_code=201,
    summary="Create a user",
    responses={**AUTH_ERRORS, 409: {"description": "username taken"}},
)
def create_user(body: UserCreate, principal: Admin, request: Request) -> User:
    _check_new_password(body.password)
    try:
        return accounts.create_user(
            store_of(request), body.username, body.password, body.role, actor=principal.actor
        )
    except AccountError as err:
        raise HTTPException(409, str(err)) from None


@router.patch(
    "/users/{user_id}",
    response_model=UserOut,
    summary="Change a user's role, disable them, or set a new password",
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def update_user(user_id: int, body: UserUpdate, principal: Admin, request: Request) -> User:
    store = store_of(request)
    if body.password is not None:
        _check_new_password(body.password)
    with store.session() as s:
        user = get_or_404(s, User, user_id, "user", lock=True)
        demoting = (body.role is not None and body.role != Role.ADMIN) or body.disabled is True
        if demoting and user.role == Role.ADMIN and not user.disabled:
            admins = s.scalar(
                select(func.count())
                .select_from(User)
                .where(User.role == Role.ADMIN, User.disabled.is_(False))
            )
            if (admins or 0) <= 1:
                raise HTTPException(409, "cannot demote or disable the last admin")
        changes: dict[str, Any] = {}
        if body.role is not None:
            user.role = body.role
            changes["role"] = body.role.value
        if body.disabled is not None:
            user.disabled = body.disabled
            changes["disabled"] = body.disabled
        if body.password is not None:
            user.password_hash = hash_password(body.password)
            user.password_changed_at = utcnow()
            changes["password"] = "reset"
        if body.disabled or body.password is not None:
            for tok in s.scalars(
                select(ApiToken).where(ApiToken.user_id == user.id, ApiToken.revoked_at.is_(None))
            ):
                tok.revoked_at = utcnow()
        store.record_event(
            "user.updated", actor=principal.actor, session=s, username=user.username, **changes
        )
        return user
