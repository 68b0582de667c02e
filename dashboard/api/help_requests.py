"""Help requests of a run's robots: the queue by risk, answers, figures
(``foundation.store.help_requests``; the robots' side is ``edge_agent.help``)."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from dashboard.api.common import AUTH_ERRORS, CONFLICT, NOT_FOUND, not_found
from dashboard.deps import Operator, Viewer, store_of
from foundation.store import help_requests as store_help
from foundation.store.help_requests import HelpRequestError

router = APIRouter(tags=["help requests"])


class HelpAnswer(BaseModel):
    """A person's answer: ``dismissed`` (the robot may go on) or ``took_over`` (the person
    takes it over, e.g. from the operator station)."""

    model_config = ConfigDict(extra="forbid")

    outcome: Literal["dismissed", "took_over"] = Field(default="dismissed")


def _run(request: Request, run_id: str) -> None:
    if store_of(request).get_run(run_id) is None:
        raise not_found("run", run_id)


@router.get(
    "/runs/{run_id}/help",
    response_model=list[dict[str, Any]],
    summary="The run's open help requests, highest risk first (the queue)",
    description="Requests older than their timeout are expired first (robots that went silent).",
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def help_queue(run_id: str, _: Viewer, request: Request) -> list[dict[str, Any]]:
    _run(request, run_id)
    store = store_of(request)
    store_help.expire_overdue(store, run_id)
    return store_help.open_requests(store, run_id)


@router.get(
    "/runs/{run_id}/help/summary",
    response_model=dict[str, Any],
    summary="The run's help figures and its latest requests",
    description=(
        "`figures`: requests, open, answered, took_over, dismissed, expired, median_wait_s, "
        "max_wait_s (answered requests), takeover_steps; `recent`: the latest 50, newest first."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def help_summary(run_id: str, _: Viewer, request: Request) -> dict[str, Any]:
    _run(request, run_id)
    store = store_of(request)
    store_help.expire_overdue(store, run_id)
    return {
        "figures": store_help.figures(store, run_id),
        "recent": store_help.recent_requests(store, run_id),
    }


@router.post(
    "/runs/{run_id}/help/{request_id}/answer",
    response_model=dict[str, Any],
    summary="Answer or dismiss one open help request",
    description=(
        "Body optional (default `dismissed`). Stores the answer (who, when, the wait) and tells the robot on its Control stream, "
        "which stops holding. 409 when the request already ended; the answer is stored even "
        "when the robot is not connected here (its request then expires on the robot)."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def answer_help(
    run_id: str,
    request_id: int,
    principal: Operator,
    request: Request,
    body: HelpAnswer | None = None,
) -> dict[str, Any]:
    _run(request, run_id)
    body = body or HelpAnswer()
    store = store_of(request)
    try:
        row = store_help.answer(store, run_id, request_id, body.outcome, principal.actor)
    except HelpRequestError as exc:
        code = 404 if "has no help request" in str(exc) else 409
        raise HTTPException(code, str(exc)) from None
    control = request.app.state.robot_control
    reason = json.dumps({"key": row["key"], "outcome": body.outcome, "by": principal.actor})
    sent = control is not None and control.push_control(
        row["robot_id"], "help_answered", run_id, reason
    )
    return {**row, "robot_told": bool(sent)}
