"""The fleet in the metadata store: robots reported by node probes, heartbeats, offline marking.

Status rules (``foundation.store.models.RobotStatus``), each change an audit event
``robot.status`` with ``{"from", "to", "reason"}``:

- a heartbeat from an e-stopped robot -> ``estopped``; from a faulty one -> ``unhealthy``;
- a healthy heartbeat -> ``leased`` when the robot has an active lease (it returns to its run),
  else ``idle``;
- no heartbeat for ``offline_after_s`` -> ``offline`` (its lease is kept, so a lost robot comes
  back to the run that held it);
- ``retired`` is final: heartbeats never revive it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Lease, Robot, RobotStatus, utcnow
from hal.spec import validate_name

_LIVE = {RobotStatus.IDLE, RobotStatus.LEASED, RobotStatus.UNHEALTHY, RobotStatus.ESTOPPED}


@dataclass
class RobotReport:
    """A robot a node probe found: what the control plane stores about it."""

    name: str
    driver: str
    robot_type: str
    spec: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, Any] = field(default_factory=dict)
    source: str = "config"  # config | serial | dds


def _set_status(
    store: MetadataStore, s: Session, robot: Robot, new: RobotStatus, reason: str
) -> bool:
    old = robot.status
    if old == new:
        return False
    robot.status = new
    store.record_event(
        "robot.status",
        robot_id=robot.id,
        session=s,
        **{"from": str(old), "to": str(new), "reason": reason, "robot": robot.name},
    )
    return True


def _has_lease(s: Session, robot_id: int) -> bool:
    q = select(Lease.id).where(Lease.robot_id == robot_id, Lease.released_at.is_(None))
    return s.scalar(q) is not None


def report_robots(
    store: MetadataStore, reports: list[RobotReport], *, node: str, node_ip: str | None
) -> list[Robot]:
    """Upsert probed robots by name; new ones start ``idle`` (the probe saw them attached).

    Specs, driver, options and ``node``/``node_ip`` tags are refreshed; statuses of known robots
    are left to heartbeats. Events: ``robot.discovered`` (new) and ``robot.reported``.

    Raises:
        ValueError: a report has an invalid robot name (nothing is written).
    """
    for r in reports:
        validate_name(r.name)
    out: list[Robot] = []
    with store.session() as s:
        for r in reports:
            tags = {**r.tags, "node": node, "driver": r.driver, "source": r.source}
            if node_ip:
                tags["node_ip"] = node_ip
            spec = {**r.spec, "driver_options": r.options}
            robot = s.scalar(select(Robot).where(Robot.name == r.name))
            if robot is None:
                robot = Robot(
                    name=r.name,
                    robot_type=r.robot_type,
                    status=RobotStatus.IDLE,
                    tags=tags,
                    spec=spec,
                    last_heartbeat_at=utcnow(),
                )
                s.add(robot)
                s.flush()
                store.record_event(
                    "robot.discovered", robot_id=robot.id, session=s, node=node, source=r.source
                )
            else:
                robot.robot_type = r.robot_type
                robot.tags = tags
                robot.spec = spec
                store.record_event("robot.reported", robot_id=robot.id, session=s, node=node)
            out.append(robot)
    return out


def heartbeat(
    store: MetadataStore,
    name: str,
    *,
    healthy: bool = True,
    estopped: bool = False,
    stats: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> RobotStatus:
    """Record a robot's liveness report and apply the status rules (module doc).

    Returns the robot's status afterwards.

    Raises:
        KeyError: no robot of that name.
    """
    with store.session() as s:
        robot = s.scalar(select(Robot).where(Robot.name == name).with_for_update())
        if robot is None:
            raise KeyError(f"no robot named {name!r}")
        robot.last_heartbeat_at = now or utcnow()
        if stats is not None:
            robot.stats = stats
        if robot.status != RobotStatus.RETIRED:
            if estopped:
                _set_status(store, s, robot, RobotStatus.ESTOPPED, "robot reports e-stop")
            elif not healthy:
                _set_status(store, s, robot, RobotStatus.UNHEALTHY, "driver reports a fault")
            else:
                live = RobotStatus.LEASED if _has_lease(s, robot.id) else RobotStatus.IDLE
                _set_status(store, s, robot, live, "healthy heartbeat")
        return robot.status


def mark_offline(
    store: MetadataStore, offline_after_s: float, *, now: datetime | None = None
) -> list[str]:
    """Mark robots silent for ``offline_after_s`` seconds ``offline``; returns their names."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=offline_after_s)
    marked: list[str] = []
    with store.session() as s:
        for robot in s.scalars(select(Robot).where(Robot.status.in_(_LIVE))):
            last = robot.last_heartbeat_at
            if last is None or last < cutoff:
                _set_status(
                    store, s, robot, RobotStatus.OFFLINE, f"no heartbeat for {offline_after_s}s"
                )
                marked.append(robot.name)
    return marked


def set_status(store: MetadataStore, name: str, status: RobotStatus, reason: str) -> None:
    """Operator override (retire, e-stop from the dashboard): set and audit a robot's status.

    Raises:
        KeyError: no robot of that name.
    """
    with store.session() as s:
        robot = s.scalar(select(Robot).where(Robot.name == name))
        if robot is None:
            raise KeyError(f"no robot named {name!r}")
        _set_status(store, s, robot, status, reason)


def list_robots(store: MetadataStore) -> list[Robot]:
    with store.session() as s:
        return list(s.scalars(select(Robot).order_by(Robot.name)))
