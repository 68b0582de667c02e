"""The operator station: one person watches many robots and drives one from the browser.

The page (``/station``) polls :func:`station_robots` and each robot's latest frame, and while
a person holds the deadman it posts one :class:`StationCommandIn` per tick (20 Hz) and between
them a heartbeat (the same command). Each goes through the cloud's comms server
(``foundation.contracts.RobotStation``) onto the robot's Control stream to its remote operator
(``edge_agent.remote``), which acts on it and echoes its id back with its next report; the
command's answer waits up to ``wait_echo_ms`` for that echo, so the page times the round trip
(key -> robot action -> page). Losing the commands (page closed, deadman released, network
gone) makes the robot hold; :func:`resume` lets it go on. Rerecord, discard and ready are the
fleet's routes (``/api/robots/{id}/...``); success / failure labels ride on a command.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Literal

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from dashboard.api.common import AUTH_ERRORS, CONFLICT, NOT_FOUND, get_or_404
from dashboard.deps import Operator, store_of
from foundation.contracts import RobotStation, StationFrame
from foundation.store.models import Lease, Robot, RobotStatus

router = APIRouter(prefix="/station", tags=["station"])

StationState = Literal[
    "autonomous",
    "taken_over",
    "waiting_for_help",
    "waiting_for_reset",
    "held",
    "idle",
    "offline",
    "retired",
]
FRESH_S = 2.0  # a report older than this says nothing about a takeover now
MEDIA = {"jpeg": "image/jpeg", "png": "image/png"}


class StationRobotOut(BaseModel):
    id: int
    name: str
    run_id: str | None = Field(description="the run the robot is leased to")
    state: StationState = Field(
        description="autonomous (the policy acts), taken_over (a station person drives it), "
        "waiting_for_reset (a person must set the cell up: Ready), held (paused or e-stopped: "
        "Resume or clear), idle, offline, retired"
    )
    heartbeat_state: str | None = Field(description="the robot computer's own state")
    frame_age_s: float | None = Field(description="seconds since the last frame; null: none")
    camera: str | None
    taken_over: bool
    note: str = Field(description="why the robot's last station takeover ended")
    autonomous_episodes: int = Field(description="since its agent started (heartbeat)")
    autonomous_successes: int


class StationCommandIn(BaseModel):
    """One tick of the page (see ``edge_agent.remote`` for how the robot reads it)."""

    model_config = ConfigDict(extra="forbid")
    id: int = Field(gt=0, description="increasing per page; the robot drops older ones")
    axes: list[float] = Field(
        default_factory=list, max_length=4, description="x, y, z, gripper, each in [-1, 1]"
    )
    deadman: bool = Field(description="the deadman key (or gamepad button) is held")
    label: Literal["", "success", "failure"] = ""
    wait_echo_ms: int = Field(
        default=0, ge=0, le=500, description="wait this long for the robot's echo of this id"
    )


class StationCommandOut(BaseModel):
    echo_id: int = Field(description="the last command id a robot step acted on")
    echoed: bool = Field(description="echo_id reached this command's id within the wait")
    taken_over: bool
    note: str


def _station(request: Request) -> RobotStation:
    control = request.app.state.robot_control
    if not isinstance(control, RobotStation):
        raise HTTPException(
            409, "the station needs the cloud's comms server in this process (robofleet cloud)"
        )
    return control


def _fresh(view: StationFrame | None) -> StationFrame | None:
    return view if view is not None and time.monotonic() - view.received < FRESH_S else None


def station_state(robot: Robot, view: StationFrame | None) -> StationState:
    """What the station says a robot does (see :class:`StationRobotOut`)."""
    if robot.status == RobotStatus.RETIRED:
        return "retired"
    if robot.status == RobotStatus.OFFLINE:
        return "offline"
    beat = str((robot.stats or {}).get("state") or "") if isinstance(robot.stats, dict) else ""
    if robot.status == RobotStatus.ESTOPPED or beat in ("paused", "estopped"):
        return "held"
    fresh = _fresh(view)
    if fresh is not None and fresh.taken_over:
        return "taken_over"
    if beat == "resetting":
        return "waiting_for_reset"
    if _waiting_for_help(robot.stats):
        return "waiting_for_help"
    if beat in ("running", "starting"):
        return "autonomous"
    return "idle"


def _waiting_for_help(stats: object) -> bool:
    """The robot's heartbeat says it asked a person and waits (``edge_agent.help``)."""
    if not isinstance(stats, dict):
        return False
    try:
        return float(stats.get("help_waiting") or 0.0) > 0.0
    except (TypeError, ValueError):
        return False


def _count(stats: object, kind: str) -> int:
    if not isinstance(stats, dict):
        return 0
    return int(
        sum(
            float(v)
            for k, v in stats.items()
            if k.startswith("autonomous/") and k.endswith(f"/{kind}") and isinstance(v, int | float)
        )
    )


@router.get(
    "/robots",
    response_model=list[StationRobotOut],
    summary="Every robot as the station shows it: state, frame age, takeover, success",
    responses=AUTH_ERRORS,
)
def station_robots(principal: Operator, request: Request) -> list[StationRobotOut]:
    control = request.app.state.robot_control
    views = control if isinstance(control, RobotStation) else None
    store = store_of(request)
    out: list[StationRobotOut] = []
    now = time.monotonic()
    with store.session() as s:
        leases = {
            lease.robot_id: lease.run_id
            for lease in s.scalars(select(Lease).where(Lease.released_at.is_(None)))
        }
        query = select(Robot).where(Robot.status != RobotStatus.RETIRED).order_by(Robot.name)
        for robot in s.scalars(query):
            view = views.station_view(robot.id) if views is not None else None
            fresh = _fresh(view)
            out.append(
                StationRobotOut(
                    id=robot.id,
                    name=robot.name,
                    run_id=leases.get(robot.id),
                    state=station_state(robot, view),
                    heartbeat_state=str(robot.stats.get("state") or "") or None
                    if isinstance(robot.stats, dict)
                    else None,
                    frame_age_s=now - view.received if view is not None and view.frame else None,
                    camera=view.camera or None if view is not None else None,
                    taken_over=fresh is not None and fresh.taken_over,
                    note=view.note if view is not None else "",
                    autonomous_episodes=_count(robot.stats, "episodes"),
                    autonomous_successes=_count(robot.stats, "successes"),
                )
            )
    return out


@router.get(
    "/robots/{robot_id}/frame",
    summary="The robot's latest camera frame (JPEG or PNG)",
    responses={**AUTH_ERRORS, 404: {"description": "unknown robot, or no frame yet"}},
    response_class=Response,
)
def frame(robot_id: int, principal: Operator, request: Request) -> Response:
    with store_of(request).session() as s:
        get_or_404(s, Robot, robot_id, "robot")  # an unknown robot is 404 wherever it runs
    view = _station(request).station_view(robot_id)
    if view is None or not view.frame:
        raise HTTPException(404, f"no frame from robot {robot_id} yet")
    return Response(
        view.frame,
        media_type=MEDIA.get(view.frame_format, "application/octet-stream"),
        headers={"Cache-Control": "no-store"},
    )


@router.post(
    "/robots/{robot_id}/command",
    response_model=StationCommandOut,
    summary="One tick of a station takeover (or its heartbeat), pushed to the robot",
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
async def command(
    robot_id: int, body: StationCommandIn, principal: Operator, request: Request
) -> StationCommandOut:
    if not all(-1.0 <= a <= 1.0 for a in body.axes):
        raise HTTPException(422, f"axes must each be in [-1, 1], got {body.axes}")
    store = store_of(request)
    run_id = await asyncio.to_thread(_leased_run, store, robot_id)  # 404 first: no such robot
    station = _station(request)
    payload = json.dumps(
        {
            "id": body.id,
            "axes": body.axes,
            "deadman": body.deadman,
            "label": body.label,
            "actor": principal.actor,
        }
    )
    pushed = await asyncio.to_thread(station.push_teleop, robot_id, payload, run_id)
    if not pushed:
        raise HTTPException(409, f"robot {robot_id} is not connected to this cloud")
    if body.label:
        await asyncio.to_thread(
            store.record_event,
            f"robot.station_{body.label}",
            actor=principal.actor,
            robot_id=robot_id,
            run_id=run_id,
        )
    deadline = time.monotonic() + body.wait_echo_ms / 1000
    view = station.station_view(robot_id)
    while (view is None or view.echo_id < body.id) and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
        view = station.station_view(robot_id)
    echo = view.echo_id if view is not None else 0
    return StationCommandOut(
        echo_id=echo,
        echoed=echo >= body.id,
        taken_over=bool(view is not None and view.taken_over),
        note=view.note if view is not None else "",
    )


def _leased_run(store: object, robot_id: int) -> str:
    """The run ``robot_id`` is leased to. 404 unknown robot, 409 not leased."""
    with store.session() as s:  # type: ignore[attr-defined]
        robot = get_or_404(s, Robot, robot_id, "robot")
        lease = s.scalar(
            select(Lease).where(Lease.robot_id == robot_id, Lease.released_at.is_(None))
        )
        if lease is None:
            raise HTTPException(409, f"robot {robot.name} is not leased: nothing to drive")
        return str(lease.run_id)


@router.post(
    "/robots/{robot_id}/resume",
    response_model=StationCommandOut,
    summary="Let a held robot go on (after a station takeover ended, or a pause)",
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def resume(robot_id: int, principal: Operator, request: Request) -> StationCommandOut:
    store = store_of(request)
    run_id = _leased_run(store, robot_id)  # 404 first: no such robot
    station = _station(request)
    if not request.app.state.robot_control.push_control(
        robot_id, "resume", run_id, f"station: {principal.actor}"
    ):
        raise HTTPException(409, f"robot {robot_id} is not connected to this cloud")
    store.record_event(
        "robot.station_resume", actor=principal.actor, robot_id=robot_id, run_id=run_id
    )
    view = station.station_view(robot_id)
    return StationCommandOut(
        echo_id=view.echo_id if view else 0,
        echoed=False,
        taken_over=bool(view and view.taken_over),
        note=view.note if view else "",
    )
