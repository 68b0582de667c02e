"""Small helpers shared by the routers."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException

# Documented error responses, merged into each route's OpenAPI entry.
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "not logged in, or unknown/expired token"},
    403: {"description": "role too low, CSRF token missing, or a robot credential"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "unknown id"}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"description": "state forbids this action"}}


def not_found(what: str, ident: object) -> HTTPException:
    return HTTPException(404, f"no {what} with id {ident!r}")


def field_error(loc: list[str | int], msg: str) -> HTTPException:
    """A 422 in FastAPI's validation-error shape, for checks that need the database."""
    return HTTPException(
        422, [{"loc": ["body", *loc], "msg": msg, "type": "value_error", "input": None}]
    )
