"""Robot liveness in the metadata store (heartbeats), beside robofleet.store.store's operations."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from robofleet.store.models import Lease, Robot, RobotStatus, utcnow
from robofleet.store.store import MetadataStore

# Heartbeat states that move an enrolled/offline robot to idle, or flag it.
_STATUS_FOR_STATE = {"estopped": RobotStatus.ESTOPPED, "fault": RobotStatus.UNHEALTHY}


def record_heartbeat(
    store: MetadataStore,
    robot_id: int,
    state: str,
    applied_policy_version: int | None,
    stats: dict[str, Any],
) -> None:
    """Store a heartbeat: time, applied policy version, control-loop stats and derived status."""
    with store.session() as s:
        robot = s.get(Robot, robot_id)
        if robot is None:
            return
        robot.last_heartbeat_at = utcnow()
        if applied_policy_version is not None:
            robot.applied_policy_version = applied_policy_version
        reported_before = (robot.stats or {}).get("state")
        robot.stats = {**stats, "state": state}
        flagged = _STATUS_FOR_STATE.get(state)
        # Flag on the robot's change of state only: an operator who cleared an e-stop in the
        # cloud while the robot still reports it (the clear is on its way) is not overruled.
        if flagged is not None and robot.status != flagged and reported_before != state:
            robot.status = flagged
            store.record_event(
                f"robot.{state}", actor=f"robot:{robot.name}", robot_id=robot_id, session=s
            )
        elif flagged is None and robot.status in (RobotStatus.ENROLLED, RobotStatus.OFFLINE):
            # A robot back from an offline spell returns to the run that still leases it.
            leased = s.scalar(
                select(Lease.id).where(Lease.robot_id == robot_id, Lease.released_at.is_(None))
            )
            robot.status = RobotStatus.LEASED if leased is not None else RobotStatus.IDLE
            store.record_event(
                "robot.status",
                actor=f"robot:{robot.name}",
                robot_id=robot_id,
                session=s,
                status=robot.status.value,
                reason="healthy heartbeat",
            )
