"""Checkpoints and policy versions: list, download, mark one promoted (approved to deploy) or roll back."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse
from sqlalchemy import select
from starlette.background import BackgroundTask

from dashboard.api.common import (
    AUTH_ERRORS,
    NOT_FOUND,
    PAGED,
    BeforeId,
    Limit,
    get_or_404,
    page_rows,
)
from dashboard.deps import Operator, Viewer, store_of
from dashboard.schemas import CheckpointOut, PolicyVersionOut
from foundation.store.models import Checkpoint, PolicyVersion

router = APIRouter(tags=["policies"])
RunFilter = Annotated[str | None, Query(max_length=64, description="only this run's")]


@router.get(
    "/policy-versions",
    response_model=list[PolicyVersionOut],
    summary="Policy versions, newest first, a page at a time",
    responses=PAGED,
)
def list_policy_versions(
    _: Viewer,
    request: Request,
    response: Response,
    run_id: RunFilter = None,
    promoted: Annotated[bool | None, Query(description="only (not) promoted ones")] = None,
    min_version: Annotated[int | None, Query(ge=0)] = None,
    max_version: Annotated[int | None, Query(ge=0)] = None,
    before_id: BeforeId = None,
    limit: Limit = 100,
) -> list[PolicyVersion]:
    q = select(PolicyVersion)
    if run_id is not None:
        q = q.where(PolicyVersion.run_id == run_id)
    if promoted is not None:
        q = q.where(PolicyVersion.promoted.is_(promoted))
    if min_version is not None:
        q = q.where(PolicyVersion.version >= min_version)
    if max_version is not None:
        q = q.where(PolicyVersion.version <= max_version)
    return page_rows(request, response, q, PolicyVersion.id, before_id, limit)


@router.post(
    "/policy-versions/{version_id}/promote",
    response_model=PolicyVersionOut,
    summary="Mark a version as the run's promoted one (an older one: a roll-back)",
    description=(
        "Records this version as the run's promoted one (and no other), with the event"
        " `policy_version.promoted`, or `policy_version.rolled_back` when a newer version was"
        " promoted before. It is the record of which version is approved to deploy; it does"
        " not change what a running learner streams: robots in a run follow its newest version."
    ),
    responses={**AUTH_ERRORS, **NOT_FOUND},
)
def promote(version_id: int, principal: Operator, request: Request) -> PolicyVersion:
    store = store_of(request)
    with store.session() as s:
        pv = get_or_404(s, PolicyVersion, version_id, "policy version", lock=True)
        previous = s.scalars(
            select(PolicyVersion).where(
                PolicyVersion.run_id == pv.run_id, PolicyVersion.promoted.is_(True)
            )
        ).all()
        before = max((p.version for p in previous), default=None)
        for p in previous:
            p.promoted = False
        pv.promoted = True
        rollback = before is not None and before > pv.version
        store.record_event(
            "policy_version.rolled_back" if rollback else "policy_version.promoted",
            actor=principal.actor,
            run_id=pv.run_id,
            session=s,
            version=pv.version,
            previous=before,
        )
        return pv


@router.get(
    "/checkpoints",
    response_model=list[CheckpointOut],
    summary="Checkpoints, newest first, a page at a time",
    responses=PAGED,
)
def list_checkpoints(
    _: Viewer,
    request: Request,
    response: Response,
    run_id: RunFilter = None,
    before_id: BeforeId = None,
    limit: Limit = 100,
) -> list[Checkpoint]:
    q = select(Checkpoint)
    if run_id is not None:
        q = q.where(Checkpoint.run_id == run_id)
    return page_rows(request, response, q, Checkpoint.id, before_id, limit)


@router.get(
    "/checkpoints/{checkpoint_id}/download",
    summary="Download a checkpoint (a file as is, a directory as a zip)",
    responses={
        **AUTH_ERRORS,
        404: {"description": "unknown id, or its files are gone"},
        200: {"content": {"application/octet-stream": {}, "application/zip": {}}},
    },
    response_class=FileResponse,
)
def download_checkpoint(checkpoint_id: int, _: Viewer, request: Request) -> FileResponse:
    with store_of(request).session() as s:
        raw = get_or_404(s, Checkpoint, checkpoint_id, "checkpoint").path
    data_dir = Path(request.app.state.settings.data_dir).resolve()
    path = Path(raw)
    path = (path if path.is_absolute() else data_dir / path).resolve()
    # Only files under data_dir are served, whatever the row says.
    if not path.is_relative_to(data_dir):
        raise HTTPException(403, "checkpoint path is outside the data directory; not served")
    if path.is_file():
        return FileResponse(path, filename=path.name, media_type="application/octet-stream")
    if path.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix="robofleet-ckpt-"))
        archive = shutil.make_archive(str(tmp / path.name), "zip", root_dir=path)
        return FileResponse(
            archive,
            filename=f"{path.name}.zip",
            media_type="application/zip",
            background=BackgroundTask(shutil.rmtree, tmp, True),
        )
    raise HTTPException(404, f"checkpoint {checkpoint_id}: files are missing on disk")
