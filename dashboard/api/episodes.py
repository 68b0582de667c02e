"""A run's episodes from its replay buffer: the list, one episode's steps (state and action
traces, intervention segments, help requests), one camera frame as PNG, and a person's
outcome label, through the app's ``foundation.contracts.EpisodeSource``
(``runs.episode_view.RunEpisodes``, which says how the buffer is reached)."""

from __future__ import annotations

import io
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from dashboard.api.common import (
    AUTH_ERRORS,
    CONFLICT,
    NOT_FOUND,
    TOTAL_HEADER,
    not_found,
)
from dashboard.deps import Operator, Viewer, store_of
from foundation.contracts import (
    EpisodeMissing,
    EpisodeRefused,
    EpisodeSource,
    EpisodesUnavailable,
)
from foundation.store.help_requests import HelpRequest
from foundation.store.models import Robot

router = APIRouter(tags=["episodes"])


class EpisodeLabel(BaseModel):
    """A person's verdict on an episode: its outcome, or ``discard`` (never trained on)."""

    model_config = ConfigDict(extra="forbid")

    label: Literal["success", "failure", "discard"]


def _source(request: Request) -> EpisodeSource:
    source: EpisodeSource | None = request.app.state.episodes
    if source is None:
        raise HTTPException(503, "this dashboard was started without access to runs' buffers")
    return source


def _call(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` of the episode source, its refusals as HTTP errors."""
    try:
        return fn(*args)
    except EpisodeMissing as exc:
        raise HTTPException(404, str(exc)) from None
    except EpisodeRefused as exc:
        raise HTTPException(409, str(exc)) from None
    except EpisodesUnavailable as exc:
        raise HTTPException(503, str(exc)) from None


def _run_dir(request: Request, run_id: str) -> str:
    run = store_of(request).get_run(run_id)
    if run is None:
        raise not_found("run", run_id)
    if not run.run_dir:
        raise HTTPException(404, f"run {run_id!r} has no run directory yet")
    return str(run.run_dir)


def _names(request: Request, ids: set[int]) -> dict[int, str]:
    with store_of(request).session() as s:
        return dict(s.execute(select(Robot.id, Robot.name).where(Robot.id.in_(ids))).all())  # type: ignore[arg-type]


def _robot_int(robot_id: str) -> int | None:
    return int(robot_id) if robot_id.isdigit() else None


def _list(request: Request, run_id: str, offset: int, limit: int) -> tuple[list[Any], int]:
    run_dir = _run_dir(request, run_id)
    found = _call(_source(request).episodes, run_id, run_dir)
    page = found[offset : offset + limit]
    with store_of(request).session() as s:
        helps: dict[tuple[int | None, int], int] = dict(
            ((robot, ep), n)
            for robot, ep, n in s.execute(
                select(HelpRequest.robot_id, HelpRequest.episode_index, func.count())
                .where(HelpRequest.run_id == run_id)
                .group_by(HelpRequest.robot_id, HelpRequest.episode_index)
            ).all()
        )
    ids = {i for e in page if (i := _robot_int(e["robot_id"])) is not None}
    names = _names(request, ids) if ids else {}
    out = []
    for e in page:
        rid = _robot_int(e["robot_id"])
        name = names.get(rid, e["robot_id"]) if rid is not None else e["robot_id"]
        out.append({**e, "robot": name, "help_requests": helps.get((rid, e["episode_index"]), 0)})
    return out, len(found)


@router.get(
    "/runs/{run_id}/episodes",
    response_model=list[dict[str, Any]],
    summary="The run's stored episodes, newest first, paged",
    description=(
        "Each: robot_id (the buffer's), robot (its name), episode_index, task, steps (stored), "
        "deleted_steps (its first steps retention deleted), done, label (success, failure, "
        "discard, rerecord or empty), label_by, interventions (steps), help_requests. "
        "`X-Total-Count`: episodes in all pages."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND, 503: {"description": "the buffer is unreadable"}},
)
async def list_episodes(
    run_id: str,
    _: Viewer,
    request: Request,
    response: Response,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[dict[str, Any]]:
    rows, total = await run_in_threadpool(_list, request, run_id, offset, limit)
    response.headers[TOTAL_HEADER] = str(total)
    return rows


def _episode(request: Request, run_id: str, robot_id: str, ep: int) -> dict[str, Any]:
    run_dir = _run_dir(request, run_id)
    out = _call(_source(request).episode, run_id, run_dir, robot_id, ep)
    rid = _robot_int(robot_id)
    with store_of(request).session() as s:
        helps = s.scalars(
            select(HelpRequest)
            .where(
                HelpRequest.run_id == run_id,
                HelpRequest.robot_id == (rid if rid is not None else -1),
                HelpRequest.episode_index == ep,
            )
            .order_by(HelpRequest.step)
        ).all()
        help_rows = [
            {"id": h.id, "step": h.step, "risk": h.risk, "outcome": h.outcome} for h in helps
        ]
    name = _names(request, {rid}).get(rid, robot_id) if rid is not None else robot_id
    return {
        "robot_id": robot_id,
        "robot": name,
        "episode_index": ep,
        **out,
        "help_requests": help_rows,
        "frame_url": f"/api/runs/{run_id}/episodes/{robot_id}/{ep}/frames/{{frame_index}}"
        "?camera={camera}",
    }


@router.get(
    "/runs/{run_id}/episodes/{robot_id}/{episode_index}",
    response_model=dict[str, Any],
    summary="One episode's steps: traces, intervention segments, help requests, frame URLs",
    description=(
        "Per stored step, in frame order: frame_index, timestamp (s), state (the non-image "
        "observation features concatenated, `state_features` names them), action (the executed "
        "action), is_intervention, reward, policy_version. `intervention_segments`: "
        "[first, last] frame indices of each run of consecutive intervention steps; "
        "`help_requests`: {id, step, risk, outcome}; `deleted_steps`/`note`: steps retention "
        "deleted; `frame_url`: a template for one camera frame (PNG)."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND, 503: {"description": "the buffer is unreadable"}},
)
async def get_episode(
    run_id: str, robot_id: str, episode_index: int, _: Viewer, request: Request
) -> dict[str, Any]:
    return await run_in_threadpool(_episode, request, run_id, robot_id, episode_index)


def _frame(request: Request, run_id: str, robot_id: str, ep: int, frame: int, camera: str) -> bytes:
    from PIL import Image

    run_dir = _run_dir(request, run_id)
    pixels = _call(_source(request).frame, run_id, run_dir, robot_id, ep, frame, camera)
    img = pixels[..., 0] if pixels.shape[-1] == 1 else pixels
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img)).save(out, format="PNG")
    return out.getvalue()


@router.get(
    "/runs/{run_id}/episodes/{robot_id}/{episode_index}/frames/{frame_index}",
    summary="One camera frame of one step as PNG",
    responses={
        **AUTH_ERRORS,
        **NOT_FOUND,
        200: {"content": {"image/png": {}}, "description": "the frame, H x W pixels"},
    },
    response_class=Response,
)
async def get_frame(
    run_id: str,
    robot_id: str,
    episode_index: int,
    frame_index: int,
    _: Viewer,
    request: Request,
    camera: Annotated[str, Query(max_length=200, description="feature; default: the first")] = "",
) -> Response:
    png = await run_in_threadpool(
        _frame, request, run_id, robot_id, episode_index, frame_index, camera
    )
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=60"})


def _label(
    request: Request, run_id: str, robot_id: str, ep: int, label: str, actor: str
) -> dict[str, Any]:
    run_dir = _run_dir(request, run_id)
    reason = f"cloud: {actor}"
    rows = _call(_source(request).label, run_id, run_dir, robot_id, ep, label, reason)
    rid = _robot_int(robot_id)
    store_of(request).record_event(
        "episode.labelled",
        actor=actor,
        run_id=run_id,
        robot_id=rid,
        episode_index=ep,
        label=label,
        rows=rows,
    )
    return {
        "robot_id": robot_id,
        "episode_index": ep,
        "label": label,
        "label_by": f"cloud: {actor}",
        "rows": rows,
    }


@router.post(
    "/runs/{run_id}/episodes/{robot_id}/{episode_index}/label",
    response_model=dict[str, Any],
    summary="Label an episode success, failure or discard (an episode mark; audited)",
    description=(
        "Stored as the buffer's episode mark with `cloud: <you>` as its reason, through the "
        "run's live sink when this process holds the run (the path robots' labels take), "
        "else in its buffer directory; event `episode.labelled`. 409: a discarded episode "
        "stays discarded, or another process holds the buffer."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT},
)
async def label_episode(
    run_id: str,
    robot_id: str,
    episode_index: int,
    body: EpisodeLabel,
    principal: Operator,
    request: Request,
) -> dict[str, Any]:
    return await run_in_threadpool(
        _label, request, run_id, robot_id, episode_index, body.label, principal.actor
    )
