"""A run's operators and the help requests assigned to them (``help.operators``, migration 0006).

A run has ``help.operators`` people (None: one at each robot, who never queue). An operator
takes the next request (:func:`take_next`): the open, unassigned request of highest risk
(then the oldest) becomes theirs, and they are busy from then until they are freed: they say
they are done (:func:`done`), answer it without taking over
(``help_requests.answer``), or the robot reports that the request closed (the person handed
back; ``help_requests.record_reports``). While every operator is busy, requests wait in the
queue. The people a cloud simulates for simulated robots take requests through the same
:func:`take_next` (``runs.help_dispatch``).

Operator time (:func:`operator_seconds`) is the time people are busy; return on human effort
(Fleet-DAgger) is autonomous successes per operator minute (:func:`return_on_effort`).

Events: ``help.assigned``, ``help.released``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from foundation.store.base import utcnow
from foundation.store.help_requests import HelpRequest, HelpRequestError, _end, release
from foundation.store.models import Robot

if TYPE_CHECKING:
    from foundation.store.metadata_store import MetadataStore


class OperatorsBusy(HelpRequestError):
    """The operator already has a request, or all of the run's operators are busy."""


def busy_operators(store: MetadataStore, run_id: str) -> dict[str, int]:
    """Operator -> the id of the request they are busy with (assigned, not released)."""
    with store.session() as s:
        rows = s.execute(
            select(HelpRequest.assigned_to, HelpRequest.id).where(
                HelpRequest.run_id == run_id,
                HelpRequest.assigned_to != "",
                HelpRequest.released_at.is_(None),
            )
        ).all()
        return {who: rid for who, rid in rows}


def take_next(
    store: MetadataStore,
    run_id: str,
    operator: str,
    operators: int | None = None,
    at: datetime | None = None,
) -> dict[str, Any] | None:
    """Assign the run's next open request (highest risk, then oldest) to ``operator``;
    ``operators`` is the run's number of people (None: no limit). Returns the request
    (``help_requests.HelpRequest.to_json``), None when none waits.

    Raises:
        OperatorsBusy: ``operator`` is busy with a request, or ``operators`` people are.
        HelpRequestError: an empty operator name.
    """
    if not operator:
        raise HelpRequestError("an operator needs a name")
    operator = operator[:128]
    busy = busy_operators(store, run_id)
    if operator in busy:
        raise OperatorsBusy(f"operator {operator} is busy with help request {busy[operator]}")
    if operators is not None and len(busy) >= operators:
        raise OperatorsBusy(f"all {operators} operators of run {run_id} are busy")
    at = at or utcnow()
    with store.session() as s:
        candidates = s.scalars(
            select(HelpRequest.id)
            .where(
                HelpRequest.run_id == run_id,
                HelpRequest.outcome.is_(None),
                HelpRequest.assigned_to == "",
            )
            .order_by(HelpRequest.risk.desc(), HelpRequest.requested_at, HelpRequest.id)
        ).all()
        for rid in candidates:
            # Conditional: two people taking at once never get the same request.
            won = s.execute(
                update(HelpRequest)
                .where(HelpRequest.id == rid, HelpRequest.assigned_to == "")
                .values(assigned_to=operator, assigned_at=at)
            )
            if not getattr(won, "rowcount", 0):
                continue
            row = s.get(HelpRequest, rid)
            assert row is not None
            s.refresh(row)
            store.record_event(
                "help.assigned",
                actor=operator,
                run_id=run_id,
                robot_id=row.robot_id,
                session=s,
                request=rid,
                risk=row.risk,
                wait_s=max(0.0, (at - row.requested_at).total_seconds()),
            )
            robot = s.get(Robot, row.robot_id)
            return row.to_json(robot.name if robot is not None else "")
    return None


def done(
    store: MetadataStore, run_id: str, operator: str, at: datetime | None = None
) -> dict[str, Any]:
    """``operator`` is done with their request: they are free; a request they never
    answered ends as ``dismissed`` by them. Returns the request.

    Raises:
        HelpRequestError: ``operator`` has no request in this run.
    """
    at = at or utcnow()
    with store.session() as s:
        row = s.scalar(
            select(HelpRequest).where(
                HelpRequest.run_id == run_id,
                HelpRequest.assigned_to == operator[:128],
                HelpRequest.released_at.is_(None),
            )
        )
        if row is None:
            raise HelpRequestError(f"operator {operator} has no help request in run {run_id}")
        if row.outcome is None:
            _end(s, store, row, "dismissed", operator, at)
        release(s, store, row, at)
        robot = s.get(Robot, row.robot_id)
        return row.to_json(robot.name if robot is not None else "")


def operator_seconds(store: MetadataStore, run_id: str, now: datetime | None = None) -> float:
    """Seconds the run's operators were busy (assignment to release; one still busy counts
    until ``now``)."""
    now = now or utcnow()
    with store.session() as s:
        rows = s.execute(
            select(HelpRequest.assigned_at, HelpRequest.released_at).where(
                HelpRequest.run_id == run_id, HelpRequest.assigned_at.is_not(None)
            )
        ).all()
    total = 0.0
    for start, end in rows:
        if start is not None:
            total += max(0.0, ((end or now) - start).total_seconds())
    return total


def return_on_effort(autonomous_successes: float, operator_s: float) -> float | None:
    """Autonomous successes per operator minute; None without operator time."""
    if operator_s <= 0:
        return None
    return autonomous_successes / (operator_s / 60.0)


def queue(store: MetadataStore, run_id: str) -> list[dict[str, Any]]:
    """The run's requests in the queue: open ones and those whose operator is still busy,
    highest risk first (then oldest), each with ``assigned_to`` ("" while it waits)."""
    with store.session() as s:
        rows = s.execute(
            select(HelpRequest, Robot.name)
            .join(Robot, Robot.id == HelpRequest.robot_id)
            .where(
                HelpRequest.run_id == run_id,
                HelpRequest.outcome.is_(None)
                | ((HelpRequest.assigned_to != "") & HelpRequest.released_at.is_(None)),
            )
            .order_by(HelpRequest.risk.desc(), HelpRequest.requested_at, HelpRequest.id)
        ).all()
        return [r.to_json(name) for r, name in rows]
