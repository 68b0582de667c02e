"""People and their tokens: bootstrap, log-in, sessions, API tokens, user management.

Every change is recorded as an audit event in the same transaction as the change.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from dashboard.security import DUMMY_HASH, hash_password, new_token, verify_password
from foundation.store.accounts import ApiToken, Role, TokenKind, User
from foundation.store.metadata_store import MetadataStore, hash_secret
from foundation.store.models import utcnow

BOOTSTRAP_USERNAME = "admin"
MIN_PASSWORD_LENGTH = 10
# Writing last_used_at on every request would serialize readers on SQLite; once a minute is enough.
_TOUCH_EVERY = timedelta(minutes=1)


class AccountError(ValueError):
    """A request about accounts cannot be done (the message says why)."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: a person, through a browser session or an API token."""

    user_id: int
    username: str
    role: Role
    via: TokenKind
    token_id: int

    @property
    def actor(self) -> str:
        return f"user:{self.username}"


def check_password_strength(password: str) -> None:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AccountError(f"password must have at least {MIN_PASSWORD_LENGTH} characters")


def ensure_bootstrap_admin(store: MetadataStore) -> tuple[str, str] | None:
    """Create the first admin when there are no users at all.

    Returns:
        (username, password) when the account was created now (print it once), else None.
    """
    with store.session() as s:
        if s.scalar(select(func.count()).select_from(User)):
            return None
    password = secrets.token_urlsafe(18)
    try:
        with store.session() as s:
            s.add(
                User(
                    username=BOOTSTRAP_USERNAME,
                    password_hash=hash_password(password),
                    role=Role.ADMIN,
                )
            )
            store.record_event("user.bootstrapped", session=s, username=BOOTSTRAP_USERNAME)
    except IntegrityError:
        return None  # another process created it first
    return BOOTSTRAP_USERNAME, password


def create_user(
    store: MetadataStore, username: str, password: str, role: Role, *, actor: str
) -> User:
    """Raises AccountError when the name is taken or the password too short."""
    check_password_strength(password)
    try:
        with store.session() as s:
            user = User(username=username, password_hash=hash_password(password), role=role)
            s.add(user)
            s.flush()
            store.record_event(
                "user.created", actor=actor, session=s, username=username, role=str(role)
            )
    except IntegrityError:
        raise AccountError(f"a user named {username!r} already exists") from None
    return user


def login(store: MetadataStore, username: str, password: str, ttl_s: float) -> str | None:
    """Check the password and open a session; returns the session token, or None."""
    with store.session() as s:
        user = s.scalar(select(User).where(User.username == username))
        ok = verify_password(password, user.password_hash if user else DUMMY_HASH)
        if user is None or not ok or user.disabled:
            store.record_event("user.login_failed", actor="anonymous", session=s, username=username)
            return None
        token = new_token()
        s.add(
            ApiToken(
                user_id=user.id,
                kind=TokenKind.SESSION,
                name="browser session",
                token_hash=hash_secret(token),
                expires_at=utcnow() + timedelta(seconds=ttl_s),
            )
        )
        store.record_event("user.login", actor=f"user:{username}", session=s)
    return token


def resolve(store: MetadataStore, token: str, kind: TokenKind) -> Principal | None:
    """The principal holding ``token`` of ``kind``, or None (unknown, expired, revoked, disabled)."""
    now = utcnow()
    with store.session() as s:
        row = s.execute(
            select(ApiToken, User)
            .join(User, User.id == ApiToken.user_id)
            .where(ApiToken.token_hash == hash_secret(token), ApiToken.kind == kind)
        ).first()
        if row is None:
            return None
        tok, user = row
        if tok.revoked_at is not None or user.disabled:
            return None
        if tok.expires_at is not None and tok.expires_at <= now:
            return None
        if tok.last_used_at is None or now - tok.last_used_at > _TOUCH_EVERY:
            tok.last_used_at = now
        return Principal(user.id, user.username, user.role, kind, tok.id)


def revoke_token(store: MetadataStore, token_id: int, *, actor: str, reason: str) -> None:
    with store.session() as s:
        tok = s.get(ApiToken, token_id)
        if tok is not None and tok.revoked_at is None:
            tok.revoked_at = utcnow()
            store.record_event(
                f"{tok.kind.value}_token.revoked",
                actor=actor,
                session=s,
                token_id=token_id,
                reason=reason,
            )


def create_api_token(
    store: MetadataStore, user_id: int, name: str, ttl_s: float | None, *, actor: str
) -> tuple[ApiToken, str]:
    """A new API token for ``user_id``; the token itself is returned once and never stored."""
    token = new_token()
    with store.session() as s:
        tok = ApiToken(
            user_id=user_id,
            kind=TokenKind.API,
            name=name,
            token_hash=hash_secret(token),
            expires_at=None if ttl_s is None else utcnow() + timedelta(seconds=ttl_s),
        )
        s.add(tok)
        s.flush()
        store.record_event("api_token.created", actor=actor, session=s, token_id=tok.id, name=name)
    return tok, token


def change_password(store: MetadataStore, user_id: int, current: str, new: str) -> None:
    """Raises AccountError when ``current`` is wrong or ``new`` too short."""
    check_password_strength(new)
    with store.session() as s:
        user = s.get(User, user_id)
        if user is None or not verify_password(current, user.password_hash):
            raise AccountError("current password is wrong")
        user.password_hash = hash_password(new)
        user.password_changed_at = utcnow()
        store.record_event("user.password_changed", actor=f"user:{user.username}", session=s)
