"""The audit log (read-only: events are written by the actions themselves)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import select

from dashboard.api.common import PAGED, BeforeId, Limit, page_rows
from dashboard.deps import Viewer
from dashboard.schemas import EventOut
from foundation.store.models import Event

router = APIRouter(tags=["audit"])


@router.get(
    "/events",
    response_model=list[EventOut],
    summary="Audit events, newest first, a page at a time",
    responses=PAGED,
)
def list_events(
    _: Viewer,
    request: Request,
    response: Response,
    run_id: Annotated[str | None, Query(max_length=64)] = None,
    robot_id: int | None = None,
    kind: Annotated[str | None, Query(max_length=64, description="exact kind or a prefix.")] = None,
    before_id: BeforeId = None,
    limit: Limit = 200,
) -> list[Event]:
    q = select(Event)
    if run_id is not None:
        q = q.where(Event.run_id == run_id)
    if robot_id is not None:
        q = q.where(Event.robot_id == robot_id)
    if kind is not None:
        q = q.where(Event.kind.startswith(kind, autoescape=True))
    return page_rows(request, response, q, Event.id, before_id, limit)
