"""Help requests of a run's robots: the queue by risk, answers, figures
(``foundation.store.help_requests``; the robots' side is ``edge_agent.help``), and the run's
operators: the queue with each request's assignee, "take the next request" and "done"
(``foundation.store.help_assignments``)."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from dashboard.api.common import AUTH_ERRORS, CONFLICT, NOT_FOUND, not_found
from dashboard.deps import Operator, Viewer, store_of
from foundation.store import help_assignments as assignments
from foundation.store import help_requests as store_help
from foundation.store.help_requests import HelpRequestError
from foundation.store.metadata_store import MetadataStore
from foundation.store.metrics import metrics_after

router = APIRouter(tags=["help requests"])


class HelpAnswer(BaseModel):
    """A person's answer: ``dismissed`` (the robot may go on) or ``took_over`` (the person
    takes it over, e.g. from the operator station)."""

    model_config = ConfigDict(extra="forbid")

    outcome: Literal["dismissed", "took_over"] = Field(default="dismissed")


def _run(request: Request, run_id: str) -> None:
    if store_of(request).get_run(run_id) is None:
        raise not_found("run", run_id)


def _operators(store: MetadataStore, run_id: str) -> int | None:
    """The run's ``help.operators`` (None: one at each robot)."""
    run = store.get_run(run_id)
    n = ((run.spec or {}).get("help") or {}).get("operators") if run is not None else None
    return int(n) if n is not None else None


def _effort(store: MetadataStore, run_id: str) -> dict[str, Any]:
    """The run's operators, who is busy, and its last recorded effort figures
    (``runs.operator_effort``; None before the first record)."""
    out: dict[str, Any] = {
        "operators": _operators(store, run_id),
        "busy": assignments.busy_operators(store, run_id),
    }
    for name in ("operator_minutes", "autonomous_successes", "return_on_human_effort"):
        last = metrics_after(store, run_id, name=name, limit=1, tail=True)
        out[name] = last[0]["value"] if last else None
    return out


def _tell(request: Request, run_id: str, row: dict[str, Any], outcome: str, by: str) -> bool:
    """Send a person's answer to the robot on its Control stream; False when not connected."""
    control = request.app.state.robot_control
    reason = json.dumps({"key": row["key"], "outcome": outcome, "by": by})
    return bool(
        control is not None
        and control.push_control(row["robot_id"], "help_answered", run_id, reason)
    )


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
        "max_wait_s (answered requests), takeover_steps; `recent`: the latest 50, newest first; "
        "`effort`: operators (null: one per robot), busy (operator -> request id), "
        "operator_minutes, autonomous_successes, return_on_human_effort (autonomous successes "
        "per operator minute)."
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
        "effort": _effort(store, run_id),
    }


@router.post(
    "/runs/{run_id}/help/{request_id}/answer",
    response_model=dict[str, Any],
    summary="Answer or dismiss one open help request",
    description=(
        'Body `{}` or `{"outcome": ...}` (default `dismissed`). Stores the answer (who, when, the wait) and tells the robot on its Control stream, '
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
    body: HelpAnswer,
) -> dict[str, Any]:
    _run(request, run_id)
    store = store_of(request)
    try:
        row = store_help.answer(store, run_id, request_id, body.outcome, principal.actor)
    except HelpRequestError as exc:
        code = 404 if "has no help request" in str(exc) else 409
        raise HTTPException(code, str(exc)) from None
    sent = _tell(request, run_id, row, body.outcome, principal.actor)
    return {**row, "robot_told": sent}


@router.get(
    "/runs/{run_id}/help/queue",
    response_model=dict[str, Any],
    summary="The run's help queue with each request's assignee, and its operators",
    description=(
        "`queue`: open requests and those whose operator is still busy, highest risk first, "
        "each with `assigned_to` (empty while it waits); `operators`: the run's number of "
        "people (null: one per robot); `busy`: operator -> request id."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def help_assignment_queue(run_id: str, _: Viewer, request: Request) -> dict[str, Any]:
    _run(request, run_id)
    store = store_of(request)
    store_help.expire_overdue(store, run_id)
    return {
        "operators": _operators(store, run_id),
        "busy": assignments.busy_operators(store, run_id),
        "queue": assignments.queue(store, run_id),
    }


@router.post(
    "/runs/{run_id}/help/take",
    response_model=dict[str, Any],
    summary="Take the next help request (highest risk): it is assigned to you",
    description=(
        "`request`: the request now yours (null when none waits). You are busy until you "
        "answer it without taking over, call `done`, or the robot reports the takeover handed "
        "back. 409 when you already have one or all the run's operators are busy. Taking a "
        "request tells the robot nothing: answer it (`took_over` / `dismissed`) to do that."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def take_next_help(run_id: str, principal: Operator, request: Request) -> dict[str, Any]:
    _run(request, run_id)
    store = store_of(request)
    store_help.expire_overdue(store, run_id)
    try:
        row = assignments.take_next(store, run_id, principal.actor, _operators(store, run_id))
    except HelpRequestError as exc:
        raise HTTPException(409, str(exc)) from None
    return {"request": row}


@router.post(
    "/runs/{run_id}/help/done",
    response_model=dict[str, Any],
    summary="Done with your help request: you are free for the next",
    description=(
        "A request you never answered ends as `dismissed` and the robot is told. 409 when "
        "you have no request in this run."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
def help_done(run_id: str, principal: Operator, request: Request) -> dict[str, Any]:
    _run(request, run_id)
    store = store_of(request)
    try:
        row = assignments.done(store, run_id, principal.actor)
    except HelpRequestError as exc:
        raise HTTPException(409, str(exc)) from None
    told = False
    if row["answered_by"] == principal.actor[:128] and row["outcome"] == "dismissed":
        told = _tell(request, run_id, row, "dismissed", principal.actor)
    return {**row, "robot_told": told}
