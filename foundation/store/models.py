"""SQLAlchemy 2 models of the metadata store (the control plane, never the per-step data path).

Tables: sites, robots, enrollment tokens, runs, leases, policy versions, checkpoints and events
(an append-only audit log). Timestamps are timezone-aware UTC. The schema is owned by the
Alembic migrations in ``foundation/store/migrations``; a test checks that they agree with these models.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Enum,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from foundation.store.base import Base, utcnow


class RobotStatus(enum.StrEnum):
    """Lifecycle of a robot as the scheduler sees it."""

    ENROLLED = "enrolled"  # credential issued, never heard from
    IDLE = "idle"  # online, not leased
    LEASED = "leased"  # held by a run
    OFFLINE = "offline"  # heartbeats missing
    ESTOPPED = "estopped"  # never scheduled until cleared
    UNHEALTHY = "unhealthy"  # driver reports a fault
    RETIRED = "retired"  # credential revoked


class RunState(enum.StrEnum):
    """States of a run (see the run manager)."""

    PENDING = "pending"
    RUNNING = "running"
    DEGRADED = "degraded"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    CRASHED = "crashed"
    RESUMING = "resuming"
    FINISHED = "finished"


class Site(Base):
    """A place where robots live (a lab room, a factory cell); a site relay may serve it."""

    __tablename__ = "sites"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    robots: Mapped[list[Robot]] = relationship(back_populates="site")


class Robot(Base):
    """An enrolled robot. ``spec`` holds its RobotSpec (features, control rate, cameras)."""

    __tablename__ = "robots"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    robot_type: Mapped[str] = mapped_column(String(128), index=True)
    site_id: Mapped[int | None] = mapped_column(ForeignKey("sites.id"))
    status: Mapped[RobotStatus] = mapped_column(
        Enum(RobotStatus, native_enum=False, length=16), default=RobotStatus.ENROLLED
    )
    tags: Mapped[dict[str, Any]] = mapped_column(default=dict)
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # sha256 of the robot's credential; the credential itself is never stored.
    credential_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column()
    applied_policy_version: Mapped[int | None] = mapped_column(Integer)
    stats: Mapped[dict[str, Any]] = mapped_column(default=dict)

    site: Mapped[Site | None] = relationship(back_populates="robots")


class EnrollmentToken(Base):
    """A one-time, expiring token a robot exchanges for its credential."""

    __tablename__ = "enrollment_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    robot_name: Mapped[str | None] = mapped_column(String(128))
    robot_type: Mapped[str | None] = mapped_column(String(128))
    site_id: Mapped[int | None] = mapped_column(ForeignKey("sites.id"))
    tags: Mapped[dict[str, Any]] = mapped_column(default=dict)  # given to the robot
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()
    used_at: Mapped[datetime | None] = mapped_column()
    used_by_robot_id: Mapped[int | None] = mapped_column(ForeignKey("robots.id"))


class Run(Base):
    """A training run: its spec, state and where its files live."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    algorithm: Mapped[str] = mapped_column(String(32))
    state: Mapped[RunState] = mapped_column(
        Enum(RunState, native_enum=False, length=16), default=RunState.PENDING, index=True
    )
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    run_dir: Mapped[str] = mapped_column(Text, default="")
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    leases: Mapped[list[Lease]] = relationship(back_populates="run")


class Lease(Base):
    """A robot held by a run. At most one active (unreleased) lease per robot, enforced by a
    partial unique index, so two runs racing for a robot cannot both win."""

    __tablename__ = "leases"
    __table_args__ = (
        Index(
            "uq_leases_active_robot",
            "robot_id",
            unique=True,
            sqlite_where=text("released_at IS NULL"),
            postgresql_where=text("released_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    robot_id: Mapped[int] = mapped_column(ForeignKey("robots.id"))
    acquired_at: Mapped[datetime] = mapped_column(default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column()

    run: Mapped[Run] = relationship(back_populates="leases")
    robot: Mapped[Robot] = relationship()


class PolicyVersion(Base):
    """A published weight version of a run's policy."""

    __tablename__ = "policy_versions"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    learner_step: Mapped[int] = mapped_column(BigInteger, default=0)
    sha256: Mapped[str] = mapped_column(String(64), default="")
    num_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    promoted: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Checkpoint(Base):
    """A durable learner checkpoint on disk."""

    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    learner_step: Mapped[int] = mapped_column(BigInteger)
    policy_version: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Event(Base):
    """Append-only audit log: who changed what, when."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    kind: Mapped[str] = mapped_column(String(64), index=True)
    actor: Mapped[str] = mapped_column(String(128), default="system")
    run_id: Mapped[str | None] = mapped_column(String(64), index=True)
    robot_id: Mapped[int | None] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
