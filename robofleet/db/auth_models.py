"""Dashboard users, their API/session tokens, and run metrics (migration 0003).

Kept in its own module so the dashboard could add them without editing ``models.py``;
``models.py`` imports this module at its end so Alembic's model comparison sees the tables.

Metrics are what the learner and run manager write for the dashboard's live charts and the
Prometheus endpoint. Names the dashboard knows (``METRIC_NAMES``), with their labels:

=======================  =========  ===============================================
name                     labels     meaning (unit)
=======================  =========  ===============================================
``success_rate``         task       fraction of evaluation/rollout episodes solved (0-1)
``intervention_rate``    task?      fraction of steps where an operator acted (0-1)
``env_steps_per_s``      robot?     environment steps per second, fleet or one robot
``learner_updates_per_s``           gradient updates per second
``loss``                            the algorithm's training loss
``buffer_size``                     transitions held by the buffer
``cache_hit_rate``                  buffer hot-cache hit ratio (0-1)
``policy_version``       robot      policy version applied on a robot
=======================  =========  ===============================================
"""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import BigInteger, Double, Enum, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from robofleet.db.models import Base, utcnow

METRIC_NAMES = (
    "success_rate",
    "intervention_rate",
    "env_steps_per_s",
    "learner_updates_per_s",
    "loss",
    "buffer_size",
    "cache_hit_rate",
    "policy_version",
)


class Role(enum.StrEnum):
    """What a person may do: viewers read, operators run the fleet, admins manage people."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


class TokenKind(enum.StrEnum):
    SESSION = "session"  # a browser login, sent as an HttpOnly cookie
    API = "api"  # a script's bearer token


class User(Base):
    """A person who logs in to the dashboard. ``password_hash`` is a salted scrypt hash."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(256))
    role: Mapped[Role] = mapped_column(Enum(Role, native_enum=False, length=16))
    disabled: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    password_changed_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A session or API token of a user; only the sha256 of the token is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    kind: Mapped[TokenKind] = mapped_column(Enum(TokenKind, native_enum=False, length=16))
    name: Mapped[str] = mapped_column(String(128), default="")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column()
    last_used_at: Mapped[datetime | None] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column()


class Metric(Base):
    """One scalar of a run at a learner step (TensorBoard's scalar shape plus fleet labels).

    ``wall_time`` is seconds since the Unix epoch (float), ``step`` the learner update count
    (or env step for fleet figures). ``robot_id`` / ``task`` are optional labels.
    """

    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_run_id_name_step", "run_id", "name", "step"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    name: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(BigInteger)
    wall_time: Mapped[float] = mapped_column(Double)
    value: Mapped[float] = mapped_column(Double)
    robot_id: Mapped[int | None] = mapped_column(ForeignKey("robots.id"))
    task: Mapped[str | None] = mapped_column(String(128))
