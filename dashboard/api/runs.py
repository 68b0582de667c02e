"""Runs: list, launch, detail, pause/stop/resume/checkpoint, metrics and their live stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from pydantic.json_schema import models_json_schema
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from dashboard.accounts import Principal
from dashboard.api.common import (
    AUTH_ERRORS,
    CONFLICT,
    NOT_FOUND,
    all_rows,
    field_error,
    not_found,
)
from dashboard.deps import Operator, Viewer, store_of
from dashboard.schemas import MetricPoint, RunCreated, RunDetail, RunOut
from foundation.contracts import RunManager
from foundation.runspec import RunSpec, RunSpecError
from foundation.store.metadata_store import MetadataStore
from foundation.store.metrics import metrics_after
from foundation.store.models import Lease, Robot, Run, RunState
from foundation.store.runs import RunNotFound, RunStateError
from runs.human_cost import human_cost

router = APIRouter(tags=["runs"])


def manager_of(request: Request) -> RunManager:
    manager: RunManager = request.app.state.run_manager
    return manager


def _get_run(store: MetadataStore, run_id: str) -> Run:
    run = store.get_run(run_id)
    if run is None:
        raise not_found("run", run_id)
    return run


@router.get(
    "/runs", response_model=list[RunOut], summary="Runs, newest first", responses=AUTH_ERRORS
)
def list_runs(
    _: Viewer,
    request: Request,
    state: Annotated[RunState | None, Query(description="only runs in this state")] = None,
) -> list[Run]:
    q = select(Run).order_by(Run.created_at.desc())
    if state is not None:
        q = q.where(Run.state == state)
    return all_rows(request, q.limit(500))


def run_spec_schemas() -> dict[str, Any]:
    """The JSON schemas of ``RunSpec`` and the models it holds, for the API's components
    (``POST /api/runs`` reads its body itself: :func:`launch_run`)."""
    _, top = models_json_schema(
        [(RunSpec, "validation")], ref_template="#/components/schemas/{model}"
    )
    schemas: dict[str, Any] = top["$defs"]
    return schemas


@router.post(
    "/runs",
    response_model=RunCreated,
    status_code=201,
    summary="Launch a run from a spec (422 names each invalid field)",
    description=(
        "The body is a run spec (`foundation.runspec.RunSpec`, the same document as "
        "`robofleet run launch SPEC`). Errors name each field by its path in `loc`, both the "
        "spec's own checks and the run manager's (unknown algorithm, policy kind, task or "
        "hyper-parameter, too few robots); nothing is created."
    ),
    responses={
        **AUTH_ERRORS,
        422: {
            "description": "invalid fields, each named by its path in `loc`",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}
            },
        },
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RunSpec"}}},
        }
    },
)
async def launch_run(principal: Operator, request: Request) -> RunCreated:
    # The body is read here, not by FastAPI: the algorithm and policy kind are checked by the
    # run manager's parser (the learner's registry) together with the spec's own fields.
    try:
        data = await request.json()
    except ValueError:
        raise field_error([("(spec)", "the body must be a JSON run spec")]) from None
    return await run_in_threadpool(_launch, data, principal, request)


def _launch(data: Any, principal: Principal, request: Request) -> RunCreated:
    store = store_of(request)
    manager = manager_of(request)
    try:
        spec = manager.parse_spec(data)
    except RunSpecError as err:
        raise field_error(list(err.errors.items())) from None
    if spec.policy.init_from_run is not None and store.get_run(spec.policy.init_from_run) is None:
        raise field_error([("policy.init_from_run", f"no run {spec.policy.init_from_run!r}")])
    try:
        run_id = manager.launch(spec, actor=principal.actor)
    except RunSpecError as err:
        raise field_error(list(err.errors.items())) from None
    return RunCreated(id=run_id, state=_get_run(store, run_id).state)


@router.get(
    "/runs/{run_id}",
    response_model=RunDetail,
    summary="One run with its leased robots",
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def get_run(run_id: str, _: Viewer, request: Request) -> RunDetail:
    store = store_of(request)
    run = _get_run(store, run_id)
    with store.session() as s:
        names = s.scalars(
            select(Robot.name)
            .join(Lease, Lease.robot_id == Robot.id)
            .where(Lease.run_id == run_id, Lease.released_at.is_(None))
            .order_by(Robot.name)
        ).all()
    return RunDetail(**RunOut.model_validate(run).model_dump(), leased_robots=list(names))


@router.get(
    "/runs/{run_id}/human-cost",
    response_model=dict[str, Any],
    summary="The run's human cost per robot and per task",
    description=(
        "Operator takeover seconds, labels, resets and their seconds, autonomous episode "
        "seconds and successes, and autonomous successes per hour excluding and including "
        "resets (runs.human_cost): from the run's report once it has one (`source: report`), "
        "else from the last heartbeat of each robot whose heartbeat names the run "
        "(`source: robots`)."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def run_human_cost(run_id: str, _: Viewer, request: Request) -> dict[str, Any]:
    store = store_of(request)
    run = _get_run(store, run_id)
    report = Path(run.run_dir) / "report.json" if run.run_dir else None
    if report is not None and report.is_file():
        try:
            cost = json.loads(report.read_text()).get("human_cost")
        except (OSError, ValueError):
            cost = None
        if isinstance(cost, dict):
            return {"source": "report", **cost}
    with store.session() as s:
        rows = s.execute(select(Robot.name, Robot.stats)).all()
    stats = {name: st for name, st in rows if isinstance(st, dict) and st.get("run_id") == run_id}
    return {"source": "robots", **human_cost(stats)}


def _act(request: Request, run_id: str, principal: Principal, action: str) -> RunOut:
    store = store_of(request)
    manager = manager_of(request)
    try:
        getattr(manager, action)(run_id, actor=principal.actor)
    except RunNotFound:
        raise not_found("run", run_id) from None
    except RunStateError as err:
        raise HTTPException(409, str(err)) from None
    return RunOut.model_validate(_get_run(store, run_id))


# (path, RunManager method, summary): one POST route each, answering with the run.
_ACTIONS = (
    ("stop", "stop", "Stop a run and release its robots"),
    ("pause", "pause", "Pause a run: robots hold still and stay leased, the learner goes on"),
    ("resume", "resume", "Resume a paused, stopped or crashed run from its last checkpoint"),
    ("checkpoint", "checkpoint_now", "Ask the learner for a checkpoint now"),
)


def _action_route(path: str, action: str) -> Any:
    def route(run_id: str, principal: Operator, request: Request) -> RunOut:
        return _act(request, run_id, principal, action)

    route.__name__ = f"{path}_run"  # the OpenAPI operation id
    return route


for _path, _action, _summary in _ACTIONS:
    router.post(
        f"/runs/{{run_id}}/{_path}",
        response_model=RunOut,
        summary=_summary,
        responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
    )(_action_route(_path, _action))


@router.get(
    "/offline-sources",
    response_model=list[dict[str, Any]],
    summary="Datasets and runs a launch can mount as offline data (buffer.offline_data)",
    description=(
        "Each is `{name, kind: dataset | run, ...}`: a dataset of the data catalog (`robofleet"
        " data import`) with its format, rows, episodes and tasks, or a run with a buffer with"
        " its state, tasks and whether it has a promoted version (`policy.init_from_run`)."
    ),
    responses=AUTH_ERRORS,
)
def list_offline_sources(_: Viewer, request: Request) -> list[dict[str, Any]]:
    return manager_of(request).offline_sources()


@router.get(
    "/runs/{run_id}/metrics",
    response_model=list[MetricPoint],
    summary="Metric points of a run, oldest first, after a point id",
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def run_metrics(
    run_id: str,
    _: Viewer,
    request: Request,
    after: Annotated[int, Query(ge=0, description="return points with a larger id")] = 0,
    name: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=50000)] = 5000,
) -> list[dict[str, Any]]:
    store = store_of(request)
    _get_run(store, run_id)
    return metrics_after(store, run_id, after, limit, name)


def _sse(event: str, data: Any, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@router.get(
    "/runs/{run_id}/stream",
    summary="Live metrics and state of a run (Server-Sent Events)",
    description=(
        "text/event-stream. `event: metrics` carries a JSON list of points (id = last point id,"
        " so a reconnecting EventSource resumes with Last-Event-ID); `event: run` carries"
        " `{state, reason, updated_at}` whenever the state changes."
    ),
    responses={
        **AUTH_ERRORS,
        **NOT_FOUND,
        200: {"content": {"text/event-stream": {}}, "description": "event stream"},
    },
    response_class=StreamingResponse,
)
async def stream_run(
    run_id: str,
    _: Viewer,
    request: Request,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    store = store_of(request)
    await run_in_threadpool(_get_run, store, run_id)
    settings = request.app.state.settings.dashboard
    start = int(last_event_id) if last_event_id and last_event_id.isdigit() else 0

    async def events() -> AsyncIterator[str]:
        last_id = start
        last_state: tuple[str, str] | None = None
        first = True
        idle = 0.0
        while not await request.is_disconnected():
            run = await run_in_threadpool(store.get_run, run_id)
            if run is not None and (run.state.value, run.reason) != last_state:
                last_state = (run.state.value, run.reason)
                yield _sse(
                    "run",
                    {
                        "state": run.state.value,
                        "reason": run.reason,
                        "updated_at": str(run.updated_at),
                    },
                )
            limit = settings.stream_backlog_points if first else 5000
            points = await run_in_threadpool(
                metrics_after, store, run_id, last_id, max(limit, 1), None, first and start == 0
            )
            first = False
            if points:
                last_id = points[-1]["id"]
                yield _sse("metrics", points, last_id)
                idle = 0.0
            else:
                idle += settings.stream_poll_interval_s
                if idle >= 15.0:  # keeps proxies from closing a quiet stream
                    idle = 0.0
                    yield ": keep-alive\n\n"
            await asyncio.sleep(settings.stream_poll_interval_s)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
