"""Help requests: a robot asked a person for help before it failed (migration 0005).

Robots report their requests in heartbeats (``info["help"]``, :func:`record_reports`); a person
answers or dismisses one through the dashboard (:func:`answer`); a request that no one
answers within its ``timeout_s`` expires (the robot says so, or :func:`expire_overdue` when the
robot went silent). Outcomes: ``took_over`` (a person took the robot over), ``dismissed`` (a
person answered without taking over), ``expired``. An ended request never opens again, so a
heartbeat that crossed an answer on its way changes nothing but the takeover figures.

Each change is an event: ``help.requested``, ``help.took_over``, ``help.dismissed``,
``help.expired``. Requests go to a run's operators through
:mod:`foundation.store.help_assignments`; a robot's report that its request closed
(``closed_at``: the person handed back, or it ended otherwise) frees the operator assigned.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Double, ForeignKey, Integer, String, UniqueConstraint, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from foundation.store.base import Base, utcnow
from foundation.store.models import Robot

if TYPE_CHECKING:
    from foundation.store.metadata_store import MetadataStore

OUTCOMES = ("took_over", "dismissed", "expired")


class HelpRequestError(ValueError):
    """A report or an answer that cannot apply (unknown request, bad outcome, already ended)."""


class HelpRequest(Base):
    """One request of one robot in one run; ``key`` is the robot's own id for it."""

    __tablename__ = "help_requests"
    __table_args__ = (UniqueConstraint("run_id", "robot_id", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), index=True)
    robot_id: Mapped[int] = mapped_column(ForeignKey("robots.id"))
    key: Mapped[str] = mapped_column(String(128))
    episode_index: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    risk: Mapped[float] = mapped_column(Double)
    timeout_s: Mapped[float] = mapped_column(Double)
    requested_at: Mapped[datetime] = mapped_column()
    answered_at: Mapped[datetime | None] = mapped_column()
    answered_by: Mapped[str] = mapped_column(String(128), default="")
    outcome: Mapped[str | None] = mapped_column(String(16))
    wait_s: Mapped[float | None] = mapped_column(Double)
    takeover_steps: Mapped[int] = mapped_column(Integer, default=0)
    label: Mapped[str] = mapped_column(String(16), default="")
    # The operator it was assigned to (migration 0006; ``help_assignments``): busy from
    # ``assigned_at`` until ``released_at``.
    assigned_to: Mapped[str] = mapped_column(String(128), default="")
    assigned_at: Mapped[datetime | None] = mapped_column()
    released_at: Mapped[datetime | None] = mapped_column()

    def to_json(self, robot_name: str = "") -> dict[str, Any]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "robot_id": self.robot_id,
            "robot_name": robot_name,
            "key": self.key,
            "episode_index": self.episode_index,
            "step": self.step,
            "risk": self.risk,
            "timeout_s": self.timeout_s,
            "requested_at": self.requested_at.isoformat(),
            "answered_at": self.answered_at.isoformat() if self.answered_at else None,
            "answered_by": self.answered_by,
            "outcome": self.outcome,
            "wait_s": self.wait_s,
            "takeover_steps": self.takeover_steps,
            "label": self.label,
            "assigned_to": self.assigned_to,
            "assigned_at": self.assigned_at.isoformat() if self.assigned_at else None,
            "released_at": self.released_at.isoformat() if self.released_at else None,
        }


def _time(value: Any, what: str) -> datetime:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HelpRequestError(f"help report {what} must be a UNIX time in seconds, got {value!r}")
    return datetime.fromtimestamp(float(value), UTC)


def _end(
    s: Session, store: MetadataStore, row: HelpRequest, outcome: str, by: str, at: datetime
) -> None:
    row.outcome = outcome
    row.answered_at = at
    row.answered_by = by[:128]
    row.wait_s = max(0.0, (at - row.requested_at).total_seconds())
    store.record_event(
        f"help.{outcome}",
        actor=by or "system",
        run_id=row.run_id,
        robot_id=row.robot_id,
        session=s,
        request=row.id,
        wait_s=row.wait_s,
    )


def release(s: Session, store: MetadataStore, row: HelpRequest, at: datetime) -> None:
    """Free the operator ``row`` is assigned to at ``at`` (not before the assignment);
    event ``help.released`` with the seconds they were busy."""
    assert row.assigned_at is not None
    row.released_at = max(at, row.assigned_at)
    store.record_event(
        "help.released",
        actor=row.assigned_to,
        run_id=row.run_id,
        robot_id=row.robot_id,
        session=s,
        request=row.id,
        busy_s=(row.released_at - row.assigned_at).total_seconds(),
    )


def record_reports(
    store: MetadataStore, robot_id: int, run_id: str, reports: Iterable[Mapping[str, Any]]
) -> int:
    """Store a robot's request reports (``edge_agent.help.HelpRequest.to_report``: key,
    episode, step, risk, timeout_s, requested_at and, once ended, outcome, ended_at, by,
    takeover_steps, label, closed_at; times in UNIX seconds). Idempotent; returns the reports applied.

    Raises:
        HelpRequestError: a report that is not a mapping, lacks a field or has a bad one.
    """
    applied = 0
    with store.session() as s:
        for rep in reports:
            if not isinstance(rep, Mapping):
                raise HelpRequestError(f"a help report must be an object, got {rep!r}")
            try:
                key = str(rep["key"])[:128]
                episode, step = int(rep["episode"]), int(rep["step"])
                risk, timeout_s = float(rep["risk"]), float(rep["timeout_s"])
            except (KeyError, TypeError, ValueError) as exc:
                raise HelpRequestError(f"help report lacks or mangles {exc}") from None
            outcome = rep.get("outcome")
            if outcome is not None and outcome not in OUTCOMES:
                raise HelpRequestError(f"help report outcome must be one of {OUTCOMES}")
            row = s.scalar(
                select(HelpRequest).where(
                    HelpRequest.run_id == run_id,
                    HelpRequest.robot_id == robot_id,
                    HelpRequest.key == key,
                )
            )
            if row is None:
                row = HelpRequest(
                    run_id=run_id,
                    robot_id=robot_id,
                    key=key,
                    episode_index=episode,
                    step=step,
                    risk=risk,
                    timeout_s=timeout_s,
                    requested_at=_time(rep.get("requested_at"), "requested_at"),
                    takeover_steps=0,
                    label="",
                    answered_by="",
                    assigned_to="",
                )
                s.add(row)
                s.flush()
                store.record_event(
                    "help.requested",
                    actor=f"robot:{robot_id}",
                    run_id=run_id,
                    robot_id=robot_id,
                    session=s,
                    request=row.id,
                    risk=risk,
                    episode=episode,
                    step=step,
                )
            if outcome is not None and row.outcome is None:
                _end(
                    s,
                    store,
                    row,
                    outcome,
                    str(rep.get("by", "")),
                    _time(rep["ended_at"], "ended_at"),
                )
            row.takeover_steps = max(row.takeover_steps, int(rep.get("takeover_steps", 0)))
            if rep.get("label"):
                row.label = str(rep["label"])[:16]
            if rep.get("closed_at") is not None and row.assigned_to and row.released_at is None:
                release(s, store, row, _time(rep["closed_at"], "closed_at"))
            applied += 1
    return applied


def answer(
    store: MetadataStore, run_id: str, request_id: int, outcome: str, by: str
) -> dict[str, Any]:
    """A person ends an open request (``took_over`` or ``dismissed``); returns the row.

    Raises:
        HelpRequestError: unknown request, an outcome a person cannot give, or already ended.
    """
    if outcome not in ("took_over", "dismissed"):
        raise HelpRequestError(f"outcome must be took_over or dismissed, got {outcome!r}")
    with store.session() as s:
        row = s.get(HelpRequest, request_id)
        if row is None or row.run_id != run_id:
            raise HelpRequestError(f"run {run_id} has no help request {request_id}")
        if row.outcome is not None:
            raise HelpRequestError(f"help request {request_id} already ended ({row.outcome})")
        now = utcnow()
        _end(s, store, row, outcome, by, now)
        if outcome == "dismissed" and row.assigned_to and row.released_at is None:
            release(s, store, row, now)  # answered without taking over: the person is free
        robot = s.get(Robot, row.robot_id)
        return row.to_json(robot.name if robot is not None else "")


def expire_overdue(store: MetadataStore, run_id: str, now: datetime | None = None) -> int:
    """End as ``expired`` the run's open requests older than their timeout (robots that went
    silent); returns how many."""
    now = now or utcnow()
    n = 0
    with store.session() as s:
        rows = s.scalars(
            select(HelpRequest).where(HelpRequest.run_id == run_id, HelpRequest.outcome.is_(None))
        ).all()
        for row in rows:
            due = row.requested_at + timedelta(seconds=row.timeout_s)
            if due <= now:
                _end(s, store, row, "expired", "", due)
                n += 1
    return n


def open_requests(store: MetadataStore, run_id: str) -> list[dict[str, Any]]:
    """The run's queue: open requests, highest risk first (then oldest)."""
    with store.session() as s:
        rows = s.execute(
            select(HelpRequest, Robot.name)
            .join(Robot, Robot.id == HelpRequest.robot_id)
            .where(HelpRequest.run_id == run_id, HelpRequest.outcome.is_(None))
            .order_by(HelpRequest.risk.desc(), HelpRequest.requested_at)
        ).all()
        return [r.to_json(name) for r, name in rows]


def recent_requests(store: MetadataStore, run_id: str, limit: int = 50) -> list[dict[str, Any]]:
    """The run's latest ``limit`` requests, newest first."""
    with store.session() as s:
        rows = s.execute(
            select(HelpRequest, Robot.name)
            .join(Robot, Robot.id == HelpRequest.robot_id)
            .where(HelpRequest.run_id == run_id)
            .order_by(HelpRequest.requested_at.desc(), HelpRequest.id.desc())
            .limit(limit)
        ).all()
        return [r.to_json(name) for r, name in rows]


def figures(store: MetadataStore, run_id: str) -> dict[str, float | int | None]:
    """requests, open, answered (took_over + dismissed), took_over, dismissed, expired,
    median_wait_s and max_wait_s over answered requests (None when none), takeover_steps."""
    with store.session() as s:
        rows = s.scalars(select(HelpRequest).where(HelpRequest.run_id == run_id)).all()
        counts = {o: sum(1 for r in rows if r.outcome == o) for o in OUTCOMES}
        waits = [
            r.wait_s
            for r in rows
            if r.outcome in ("took_over", "dismissed") and r.wait_s is not None
        ]
        return {
            "requests": len(rows),
            "open": sum(1 for r in rows if r.outcome is None),
            "answered": counts["took_over"] + counts["dismissed"],
            **counts,
            "median_wait_s": statistics.median(waits) if waits else None,
            "max_wait_s": max(waits) if waits else None,
            "takeover_steps": sum(r.takeover_steps for r in rows),
        }
