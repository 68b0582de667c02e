"""The audit log (read-only: events are written by the actions themselves)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from sqlalchemy import select

from dashboard.api.common import AUTH_ERRORS, all_rows
from dashboard.deps import Viewer
from dashboard.schemas import EventOut
from robofleet.store.models import Event

router = APIRouter(tags=["audit"])


@router.get(
    "/events",
    response_model=list[EventOut],
    summary="Audit events, newest first",
    responses=AUTH_ERRORS,
)
def list_events(
    _: Viewer,
    request: Request,
    run_id: Annotated[str | None, Query(max_length=64)] = None,
    robot_id: int | None = None,
    kind: Annotated[str | None, Query(max_length=64, description="exact kind or a prefix.")] = None,
    before_id: Annotated[
        int | None, Query(ge=1, description="page: events older than this")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[Event]:
    q = select(Event).order_by(Event.id.desc())
    if run_id is not None:
        q = q.where(Event.run_id == run_id)
    if robot_id is not None:
        q = q.where(Event.robot_id == robot_id)
    if kind is not None:
        q = q.where(Event.kind.startswith(kind, autoescape=True))
    if before_id is not None:
        q = q.where(Event.id < before_id)
    return all_rows(request, q.limit(limit))
