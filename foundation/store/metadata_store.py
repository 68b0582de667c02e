"""The metadata store: engine set-up, migrations, and the few operations that must be atomic.

SQLite (WAL mode, full fsync) is the embedded default; PostgreSQL is selected by URL
(``postgresql+psycopg://user@127.0.0.1:5432/robofleet``).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import CursorResult, Engine, create_engine, event, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from foundation.store.models import (
    EnrollmentToken,
    Event,
    Lease,
    Robot,
    RobotStatus,
    Run,
    utcnow,
)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

# A robot in one of these states is never handed to a run.
UNSCHEDULABLE = {
    RobotStatus.ESTOPPED,
    RobotStatus.UNHEALTHY,
    RobotStatus.RETIRED,
    RobotStatus.OFFLINE,
}


class LeaseConflict(RuntimeError):
    """Some requested robots are already leased or cannot be scheduled; nothing was leased."""

    def __init__(self, robots: Sequence[str], why: str) -> None:
        super().__init__(f"cannot lease {', '.join(robots)}: {why}")
        self.robots = list(robots)


class EnrollmentError(PermissionError):
    """An enrollment token is unknown, expired or already used."""


def hash_secret(value: str) -> str:
    """sha256 hex digest used to store tokens and credentials without keeping them."""
    return hashlib.sha256(value.encode()).hexdigest()


def command_line_token(nbytes: int = 32) -> str:
    """A URL-safe random token (``nbytes`` of entropy) that never starts with ``-``, so
    ``robofleet edge --token T`` cannot read it as an option (1 in 64 would)."""
    while True:
        token = secrets.token_urlsafe(nbytes)
        if not token.startswith("-"):
            return token


def make_engine(url: str) -> Engine:
    """Create an engine; for SQLite, create the parent directory and turn on WAL and fsync."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin_immediate(conn: Any) -> None:
            # Take the write lock at BEGIN so two writers serialize instead of failing on upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        # pysqlite's own transaction handling must be off for the BEGIN above to be ours.
        @event.listens_for(engine, "connect", insert=True)
        def _sqlite_autocommit_off(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None

        return engine
    return create_engine(url, pool_pre_ping=True)


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` in place to ``revision`` (rows are kept)."""
    from alembic import command

    make_engine(url).dispose()  # creates the SQLite directory
    command.upgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    """The Alembic revision the database is at, or None for an empty database."""
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


class MetadataStore:
    """Access to the metadata database. Thread-safe; one per process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any error."""
        with self._sessions() as s, s.begin():
            yield s

    def record_event(
        self,
        kind: str,
        *,
        actor: str = "system",
        run_id: str | None = None,
        robot_id: int | None = None,
        session: Session | None = None,
        **data: Any,
    ) -> None:
        """Append an audit event (inside ``session`` when given, so it commits with the change)."""
        ev = Event(kind=kind, actor=actor, run_id=run_id, robot_id=robot_id, data=data)
        if session is not None:
            session.add(ev)
            return
        with self.session() as s:
            s.add(ev)

    # -- enrollment -------------------------------------------------------------------------

    def create_enrollment_token(
        self,
        ttl: timedelta,
        *,
        robot_name: str | None = None,
        robot_type: str | None = None,
        site_id: int | None = None,
        tags: dict[str, Any] | None = None,
        actor: str = "system",
    ) -> str:
        """Create a one-time token valid for ``ttl``; returns the token (only its hash is
        stored). The robot that uses it gets ``tags`` (what runs select robots by)."""
        token = command_line_token()
        with self.session() as s:
            s.add(
                EnrollmentToken(
                    token_hash=hash_secret(token),
                    robot_name=robot_name,
                    robot_type=robot_type,
                    site_id=site_id,
                    tags=dict(tags or {}),
                    expires_at=utcnow() + ttl,
                )
            )
            self.record_event(
                "enrollment_token.created", actor=actor, session=s, robot_name=robot_name
            )
        return token

    def consume_enrollment_token(
        self, token: str, *, robot_name: str, robot_type: str, spec: dict[str, Any]
    ) -> tuple[Robot, str]:
        """Exchange a token for a new robot and its credential, exactly once.

        Returns:
            (robot, credential): the credential is shown to the robot once; only its hash is kept.

        Raises:
            EnrollmentError: the token is unknown, expired or already used (the check and the
                marking as used are one conditional UPDATE, so two racing robots cannot both win).
        """
        now = utcnow()
        credential = secrets.token_urlsafe(32)
        th = hash_secret(token)
        with self.session() as s:
            tok = s.scalar(select(EnrollmentToken).where(EnrollmentToken.token_hash == th))
            if tok is None:
                raise EnrollmentError("unknown enrollment token")
            if tok.used_at is not None:
                raise EnrollmentError("enrollment token already used")
            if tok.expires_at <= now:
                raise EnrollmentError("enrollment token expired")
            name = tok.robot_name or robot_name
            robot = Robot(
                name=name,
                robot_type=tok.robot_type or robot_type,
                site_id=tok.site_id,
                tags=dict(tok.tags or {}),
                spec=spec,
                credential_hash=hash_secret(credential),
            )
            s.add(robot)
            s.flush()
            claimed: CursorResult[Any] = s.execute(  # type: ignore[assignment]
                update(EnrollmentToken)
                .where(EnrollmentToken.id == tok.id, EnrollmentToken.used_at.is_(None))
                .values(used_at=now, used_by_robot_id=robot.id)
            )
            if claimed.rowcount != 1:
                raise EnrollmentError("enrollment token already used")
            self.record_event("robot.enrolled", actor=f"robot:{name}", robot_id=robot.id, session=s)
        return robot, credential

    def robot_for_credential(self, credential: str) -> Robot | None:
        """The robot holding ``credential``, or None (unknown or revoked)."""
        with self.session() as s:
            robot = s.scalar(select(Robot).where(Robot.credential_hash == hash_secret(credential)))
            if robot is None or robot.status == RobotStatus.RETIRED:
                return None
            return robot

    # -- leases -----------------------------------------------------------------------------

    def lease_robots(
        self, run_id: str, robot_ids: Sequence[int], *, actor: str = "scheduler"
    ) -> None:
        """Lease all of ``robot_ids`` to ``run_id`` in one transaction, or none of them.

        Raises:
            LeaseConflict: a robot is already leased (the partial unique index refuses a second
                active lease, also under concurrent transactions), unschedulable, or unknown.
        """
        try:
            with self.session() as s:
                robots = s.scalars(select(Robot).where(Robot.id.in_(robot_ids))).all()
                found = {r.id for r in robots}
                missing = [str(i) for i in robot_ids if i not in found]
                if missing:
                    raise LeaseConflict(missing, "no such robot")
                bad = [r.name for r in robots if r.status in UNSCHEDULABLE]
                if bad:
                    raise LeaseConflict(bad, "robot is e-stopped, unhealthy, offline or retired")
                for r in robots:
                    s.add(Lease(run_id=run_id, robot_id=r.id))
                    r.status = RobotStatus.LEASED
                s.flush()
                for r in robots:
                    self.record_event(
                        "lease.acquired", actor=actor, run_id=run_id, robot_id=r.id, session=s
                    )
        except IntegrityError:
            with self.session() as s:
                names = s.scalars(select(Robot.name).where(Robot.id.in_(robot_ids))).all()
            raise LeaseConflict(list(names), "already leased to another run") from None

    def release_leases(
        self, run_id: str, robot_ids: Sequence[int] | None = None, *, actor: str = "scheduler"
    ) -> int:
        """Release the run's active leases (all, or those of ``robot_ids``); returns how many."""
        with self.session() as s:
            q = select(Lease).where(Lease.run_id == run_id, Lease.released_at.is_(None))
            if robot_ids is not None:
                q = q.where(Lease.robot_id.in_(robot_ids))
            leases = s.scalars(q).all()
            now = utcnow()
            for lease in leases:
                lease.released_at = now
                robot = s.get(Robot, lease.robot_id)
                if robot is not None and robot.status == RobotStatus.LEASED:
                    robot.status = RobotStatus.IDLE
                self.record_event(
                    "lease.released", actor=actor, run_id=run_id, robot_id=lease.robot_id, session=s
                )
            return len(leases)

    def active_leases(self, run_id: str | None = None) -> list[Lease]:
        with self.session() as s:
            q = select(Lease).where(Lease.released_at.is_(None))
            if run_id is not None:
                q = q.where(Lease.run_id == run_id)
            return list(s.scalars(q).all())

    def get_run(self, run_id: str) -> Run | None:
        with self.session() as s:
            return s.get(Run, run_id)
