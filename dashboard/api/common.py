"""Small helpers shared by the routers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import HTTPException, Query, Request, Response
from sqlalchemy import Select, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from dashboard.deps import store_of

# Documented error responses, merged into each route's OpenAPI entry.
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "not logged in, or unknown/expired token"},
    403: {"description": "role too low, CSRF token missing, or a robot credential"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "unknown id"}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"description": "state forbids this action"}}


def not_found(what: str, ident: object) -> HTTPException:
    return HTTPException(404, f"no {what} with id {ident!r}")


def get_or_404[T](s: Session, model: type[T], ident: object, what: str, *, lock: bool = False) -> T:
    """The ``model`` row with primary key ``ident`` (``lock``: SELECT ... FOR UPDATE).

    Raises:
        HTTPException: 404 naming ``what`` and the id.
    """
    row = s.get(model, ident, with_for_update=True if lock else None)
    if row is None:
        raise not_found(what, ident)
    return row


def all_rows[T](request: Request, query: Select[T]) -> list[T]:
    """Every row of ``query`` (a ``select`` of one model) from the app's metadata store."""
    with store_of(request).session() as s:
        return list(s.scalars(query))


TOTAL_HEADER = "X-Total-Count"
# The query parameters and the documented response of a list read with page_rows.
BeforeId = Annotated[int | None, Query(ge=1, description="page: rows older than this id")]
Limit = Annotated[int, Query(ge=1, le=1000, description="rows per page")]
PAGED: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    200: {"headers": {TOTAL_HEADER: {"description": "rows matching, in all pages"}}},
}


def page_rows[T](
    request: Request,
    response: Response,
    query: Select[T],
    id_column: InstrumentedAttribute[int],
    before_id: int | None,
    limit: int,
) -> list[T]:
    """One page of ``query`` (a filtered ``select`` of one model), newest (largest id) first:
    at most ``limit`` rows with ids below ``before_id`` (a cursor, so rows added meanwhile do
    not shift the pages). The ``X-Total-Count`` header says how many rows match in all."""
    with store_of(request).session() as s:
        total = s.scalar(select(func.count()).select_from(query.order_by(None).subquery()))
        response.headers[TOTAL_HEADER] = str(total or 0)
        if before_id is not None:
            query = query.where(id_column < before_id)
        return list(s.scalars(query.order_by(id_column.desc()).limit(limit)))


def field_error(errors: list[tuple[str, str]]) -> HTTPException:
    """A 422 in FastAPI's validation-error shape for checks beyond the body's schema (they need
    the database or the run manager): ``(dotted field path, message)`` pairs, e.g.
    ``("robots.count", "...")``; a path in parentheses (``"(spec)"``) names the whole body;
    an index (``buffer.offline_data[1]``) becomes its own step, as pydantic writes it."""
    return HTTPException(
        422,
        [
            {
                "loc": ["body", *([] if path.startswith("(") else _loc(path))],
                "msg": msg,
                "type": "value_error",
                "input": None,
            }
            for path, msg in errors
        ],
    )


def _loc(path: str) -> list[str | int]:
    """``"buffer.offline_data[1]"`` -> ``["buffer", "offline_data", 1]``."""
    out: list[str | int] = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        out.append(name)
        if rest.endswith("]") and rest[:-1].isdigit():
            out.append(int(rest[:-1]))
    return out
