"""Fleet: robots (list, e-stop, clear, rerecord / discard the running episode, release, retire),
sites, and enrollment tokens."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from comms.cloud.enrollment_tokens import issue_enrollment
from dashboard.accounts import Principal
from dashboard.api.common import AUTH_ERRORS, CONFLICT, NOT_FOUND, all_rows, get_or_404
from dashboard.deps import Admin, Operator, Viewer, store_of
from dashboard.robot_view import activity, spec_summary
from dashboard.schemas import (
    ActivityState,
    EnrollmentCreated,
    EnrollmentRequest,
    EnrollmentTokenOut,
    RobotOut,
    SiteCreate,
    SiteOut,
)
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import EnrollmentToken, Lease, Robot, RobotStatus, Site, utcnow

router = APIRouter(tags=["fleet"])


def _robot_out(robot: Robot, lease_run: str | None, now: datetime) -> RobotOut:
    hb = robot.last_heartbeat_at
    p99 = robot.stats.get("control_loop_p99_ms") if isinstance(robot.stats, dict) else None
    return RobotOut(
        id=robot.id,
        name=robot.name,
        robot_type=robot.robot_type,
        status=robot.status,
        site=robot.site.name if robot.site else None,
        tags=robot.tags,
        last_heartbeat_at=hb,
        heartbeat_age_s=None if hb is None else max(0.0, (now - hb).total_seconds()),
        leased_run_id=lease_run,
        applied_policy_version=robot.applied_policy_version,
        control_loop_p99_ms=float(p99) if isinstance(p99, int | float) else None,
        stats=robot.stats,
        activity=activity(robot, lease_run),
        spec_summary=spec_summary(robot.spec),
    )


def _active_lease(s: Session, robot_id: int) -> Lease | None:
    return s.scalar(select(Lease).where(Lease.robot_id == robot_id, Lease.released_at.is_(None)))


def robots_out(
    store: MetadataStore,
    state: ActivityState | None = None,
    run_id: str | None = None,
    robot_type: str | None = None,
) -> list[RobotOut]:
    """The fleet's robots by name, those whose activity is ``state``, that act in, are leased
    to or refused ``run_id``, of ``robot_type`` (each filter when given)."""
    now = utcnow()
    with store.session() as s:
        leases = {
            lease.robot_id: lease.run_id
            for lease in s.scalars(select(Lease).where(Lease.released_at.is_(None)))
        }
        query = select(Robot).order_by(Robot.name)
        if robot_type is not None:
            query = query.where(Robot.robot_type == robot_type)
        rows = [_robot_out(r, leases.get(r.id), now) for r in s.scalars(query)]
    return [
        r
        for r in rows
        if (state is None or r.activity.state == state)
        and (run_id is None or run_id in (r.activity.run_id, r.leased_run_id))
    ]


@router.get(
    "/robots",
    response_model=list[RobotOut],
    summary="Robots of the fleet with what each does now (activity) and is (spec_summary)",
    responses=AUTH_ERRORS,
)
def list_robots(
    _: Viewer,
    request: Request,
    state: Annotated[ActivityState | None, Query(description="only robots doing this")] = None,
    run_id: Annotated[
        str | None, Query(max_length=64, description="only robots in, leased to or refusing it")
    ] = None,
    robot_type: Annotated[str | None, Query(max_length=128)] = None,
) -> list[RobotOut]:
    return robots_out(store_of(request), state, run_id, robot_type)


@router.get(
    "/robots/{robot_id}",
    response_model=RobotOut,
    summary="One robot",
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def get_robot(robot_id: int, _: Viewer, request: Request) -> RobotOut:
    with store_of(request).session() as s:
        robot = get_or_404(s, Robot, robot_id, "robot")
        lease = _active_lease(s, robot_id)
        return _robot_out(robot, lease.run_id if lease else None, utcnow())


def _set_status(
    request: Request,
    robot_id: int,
    principal: Principal,
    kind: str,
    allowed: set[RobotStatus] | None,
    target: RobotStatus,
    release: bool,
) -> RobotOut:
    store = store_of(request)
    with store.session() as s:
        robot = get_or_404(s, Robot, robot_id, "robot", lock=True)
        if allowed is not None and robot.status not in allowed:
            raise HTTPException(409, f"robot {robot.name} is {robot.status.value}; cannot {kind}")
        before = robot.status
        lease = _active_lease(s, robot_id)
        if release and lease is not None:
            lease.released_at = utcnow()
            store.record_event(
                "lease.released",
                actor=principal.actor,
                run_id=lease.run_id,
                robot_id=robot_id,
                session=s,
            )
            lease = None
        robot.status = target
        store.record_event(
            f"robot.{kind}",
            actor=principal.actor,
            robot_id=robot_id,
            run_id=lease.run_id if lease else None,
            session=s,
            before=before.value,
            after=target.value,
        )
        return _robot_out(robot, lease.run_id if lease else None, utcnow())


@router.post(
    "/robots/{robot_id}/estop",
    response_model=RobotOut,
    summary="Mark a robot e-stopped: it is never scheduled until cleared (its lease stays)",
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def estop(robot_id: int, principal: Operator, request: Request) -> RobotOut:
    out = _set_status(
        request, robot_id, principal, "estopped", None, RobotStatus.ESTOPPED, release=False
    )
    _push(request, robot_id, "estop", principal)
    return out


def _push(request: Request, robot_id: int, kind: str, principal: Principal) -> None:
    """Tell the robot now when the cloud's comms server is in this process (else the cloud's
    e-stop sync delivers it from the store)."""
    control = request.app.state.robot_control
    if control is not None:
        control.push_control(robot_id, kind, reason=f"dashboard: {principal.actor}")


@router.post(
    "/robots/{robot_id}/clear-estop",
    response_model=RobotOut,
    summary="Clear an e-stop; the robot becomes idle (schedulable) again",
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def clear_estop(robot_id: int, principal: Operator, request: Request) -> RobotOut:
    out = _set_status(
        request,
        robot_id,
        principal,
        "estop_cleared",
        {RobotStatus.ESTOPPED},
        RobotStatus.IDLE,
        release=True,
    )
    _push(request, robot_id, "clear_estop", principal)
    return out


def _push_to_leased(
    robot_id: int, kind: str, principal: Principal, request: Request, what: str
) -> str:
    """Push control command ``kind`` to a leased, connected robot; its run id. 409 when it is
    not leased or not connected here (``what``: what it would have done, for the message)."""
    store = store_of(request)
    with store.session() as s:
        robot = get_or_404(s, Robot, robot_id, "robot")
        lease = _active_lease(s, robot_id)
        name, run_id = robot.name, lease.run_id if lease else None
    if run_id is None:
        raise HTTPException(409, f"robot {name} is not leased: {what}")
    control = request.app.state.robot_control
    reason = f"dashboard: {principal.actor}"
    if control is None or not control.push_control(robot_id, kind, run_id, reason):
        raise HTTPException(409, f"robot {name} is not connected to this cloud; {what}")
    return run_id


def _episode_command(robot_id: int, kind: str, principal: Principal, request: Request) -> RobotOut:
    """Push ``kind`` (rerecord / discard) to the robot: it ends its running episode and marks it
    never to be trained on. 409 when it runs no episode for a run or is not connected here."""
    run_id = _push_to_leased(robot_id, kind, principal, request, f"its episode cannot be {kind}ed")
    store_of(request).record_event(
        f"robot.episode_{kind}", actor=principal.actor, robot_id=robot_id, run_id=run_id
    )
    return get_robot(robot_id, principal, request)


@router.post(
    "/robots/{robot_id}/rerecord",
    response_model=RobotOut,
    summary="End the robot's running episode, never train on it, record its task again",
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def rerecord(robot_id: int, principal: Operator, request: Request) -> RobotOut:
    return _episode_command(robot_id, "rerecord", principal, request)


@router.post(
    "/robots/{robot_id}/discard",
    response_model=RobotOut,
    summary="End the robot's running episode and never train on it",
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def discard(robot_id: int, principal: Operator, request: Request) -> RobotOut:
    return _episode_command(robot_id, "discard", principal, request)


@router.post(
    "/robots/{robot_id}/ready",
    response_model=RobotOut,
    summary="The robot's cell is set up again: a robot holding for a reset by hand goes on",
    description=(
        "For robots that cannot reset themselves (`capabilities.can_reset: false`): after each "
        "episode they hold (heartbeat state `resetting`, or `paused` after "
        "`edge.reset_timeout_s`) until their operator says ready. 409 when the robot is not "
        "leased or not connected to this cloud."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def ready(robot_id: int, principal: Operator, request: Request) -> RobotOut:
    run_id = _push_to_leased(robot_id, "ready", principal, request, "ready cannot reach it")
    store_of(request).record_event(
        "robot.ready", actor=principal.actor, robot_id=robot_id, run_id=run_id
    )
    return get_robot(robot_id, principal, request)


@router.post(
    "/robots/{robot_id}/release",
    response_model=RobotOut,
    summary="Release the robot's lease; the run continues without it",
    responses={**AUTH_ERRORS, **NOT_FOUND, 409: {"description": "robot holds no lease"}},
)
def release(robot_id: int, principal: Operator, request: Request) -> RobotOut:
    store = store_of(request)
    with store.session() as s:
        robot = get_or_404(s, Robot, robot_id, "robot")
        lease = _active_lease(s, robot_id)
        if lease is None:
            raise HTTPException(409, f"robot {robot.name} is not leased")
        run_id = lease.run_id
    store.release_leases(run_id, [robot_id], actor=principal.actor)
    return get_robot(robot_id, principal, request)


@router.post(
    "/robots/{robot_id}/retire",
    response_model=RobotOut,
    summary="Retire a robot: its credential stops working and its lease is released",
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def retire(robot_id: int, principal: Admin, request: Request) -> RobotOut:
    allowed = set(RobotStatus) - {RobotStatus.RETIRED}
    return _set_status(
        request, robot_id, principal, "retired", allowed, RobotStatus.RETIRED, release=True
    )


# -- sites -----------------------------------------------------------------------------------


@router.get("/sites", response_model=list[SiteOut], summary="Sites", responses=AUTH_ERRORS)
def list_sites(_: Viewer, request: Request) -> list[Site]:
    return all_rows(request, select(Site).order_by(Site.name))


@router.post(
    "/sites",
    response_model=SiteOut,
    status_code=201,
    summary="Create a site",
    responses={**AUTH_ERRORS, 409: {"description": "name taken"}},
)
def create_site(body: SiteCreate, principal: Admin, request: Request) -> Site:
    store = store_of(request)
    try:
        with store.session() as s:
            site = Site(name=body.name, description=body.description)
            s.add(site)
            s.flush()
            store.record_event("site.created", actor=principal.actor, session=s, name=body.name)
            return site
    except IntegrityError:
        raise HTTPException(409, f"a site named {body.name!r} already exists") from None


# -- enrollment ------------------------------------------------------------------------------


@router.get(
    "/enrollment-tokens",
    response_model=list[EnrollmentTokenOut],
    summary="Enrollment tokens (newest first; the tokens themselves are never stored)",
    responses=AUTH_ERRORS,
)
def list_enrollment_tokens(_: Operator, request: Request) -> list[EnrollmentToken]:
    return all_rows(request, select(EnrollmentToken).order_by(EnrollmentToken.id.desc()).limit(100))


@router.post(
    "/enrollment-tokens",
    response_model=EnrollmentCreated,
    status_code=201,
    summary="Create a one-time enrollment token and the command to run on the robot",
    responses=AUTH_ERRORS,
)
def create_enrollment_token(
    body: EnrollmentRequest, principal: Operator, request: Request
) -> EnrollmentCreated:
    comms = request.app.state.settings.comms
    issued = issue_enrollment(
        store_of(request),
        server=comms.cloud_address,
        ttl=timedelta(seconds=body.ttl_s or comms.enrollment_token_ttl_s),
        robot_name=body.robot_name,
        robot_type=body.robot_type,
        tags=body.tags,
        driver=body.driver,
        driver_options=body.driver_options,
        operator=body.operator,
        operator_options=body.operator_options,
        actor=principal.actor,
    )
    return EnrollmentCreated(
        token=issued.token, expires_at=issued.expires_at, command=issued.command
    )
