"""Robot liveness in the metadata store: heartbeats recorded, beside
:class:`foundation.store.metadata_store.MetadataStore`'s operations."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from foundation.store.help_requests import HelpRequestError, record_reports
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Lease, Robot, RobotStatus, utcnow

# Heartbeat states that move an enrolled/offline robot to idle, or flag it.
_STATUS_FOR_STATE = {"estopped": RobotStatus.ESTOPPED, "fault": RobotStatus.UNHEALTHY}


def record_heartbeat(
    store: MetadataStore,
    robot_id: int,
    state: str,
    applied_policy_version: int | None,
    stats: dict[str, Any],
    run_id: str = "",
    info: dict[str, Any] | None = None,
) -> None:
    """Store a heartbeat: time, applied policy version, control-loop stats and derived status.

    ``robot.stats`` keeps the stats with the reported ``state`` and ``run_id`` beside them
    (what the run driver reads to see which run a robot acts in), and ``info["refused"]``
    when there is one; ``info["robot"]`` (an idle robot computer's description: ``spec``,
    ``driver``, ``operator``) refreshes the robot's stored spec; ``info["help"]`` (the robot's
    help requests, ``edge_agent.help``) goes to ``foundation.store.help_requests``.

    Raises:
        HelpRequestError: ``info["help"]`` is not a list of valid reports (named).
    """
    reports = (info or {}).get("help")
    if reports is not None:
        if not isinstance(reports, list):
            raise HelpRequestError("info.help must be a list of help request reports")
        if run_id:
            record_reports(store, robot_id, run_id, reports)
    with store.session() as s:
        robot = s.get(Robot, robot_id)
        if robot is None:
            return
        robot.last_heartbeat_at = utcnow()
        if applied_policy_version is not None:
            robot.applied_policy_version = applied_policy_version
        reported_before = (robot.stats or {}).get("state")
        robot.stats = {**stats, "state": state, "run_id": run_id}
        info = info or {}
        if info.get("refused"):
            robot.stats["refused"] = str(info["refused"])[:2000]
        described = info.get("robot")
        if isinstance(described, dict) and isinstance(described.get("spec"), dict):
            computer = {k: v for k, v in described.items() if k != "spec"}
            robot.spec = {**described["spec"], "computer": computer}
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
