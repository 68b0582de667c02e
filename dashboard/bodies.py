"""Every malformed request body is a 422 in FastAPI's validation-error shape, never a 500.

Two holes are closed here, once for the whole app:

* Python's json reads ``NaN``, ``Infinity`` and ``-Infinity`` (and turns ``1e999`` into
  infinity), none of which RFC 8259 JSON can carry: a float field took them silently, and a
  validation error that echoed one could not be encoded (``ValueError: Out of range float
  values are not JSON compliant``, a 500). :func:`body_errors` refuses them where the body is
  read, naming each one's path in the body; it also answers bodies json raises something other
  than a ``JSONDecodeError`` for (not UTF-8, nested too deeply), which FastAPI answers 400.
* A validation error echoes the input it refused; :func:`validation_error` spells what JSON
  cannot carry (non-finite floats, bytes that are not UTF-8) as text before encoding it.
"""

from __future__ import annotations

import email.message
import json
import math
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.responses import Response

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
Loc = tuple[str | int, ...]


class _NonFinite:
    """Where a number JSON cannot carry was in the body, as written there."""

    def __init__(self, text: str) -> None:
        self.text = text


def _number(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _non_finite(value: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if isinstance(value, _NonFinite):
        yield loc, value.text
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite(item, (*loc, index))


def _not_json(loc: Loc, reason: str) -> dict[str, Any]:
    return {
        "type": "json_invalid",
        "loc": list(loc),
        "msg": "JSON decode error",
        "input": {},
        "ctx": {"error": reason},
    }


def body_errors(body: bytes) -> list[dict[str, Any]]:
    """What is wrong with ``body`` as an RFC 8259 JSON document; ``[]`` when nothing is.

    Returns:
        FastAPI's validation-error entries (``loc`` starts with ``"body"``): one
        ``json_invalid`` when ``body`` is not JSON (``loc`` ends with the character offset
        when json gives one), else one ``finite_number`` per ``NaN``, ``Infinity``,
        ``-Infinity`` or overflowing number, ``loc`` its path (``["body", "hyperparameters",
        "lr"]``) and ``input`` its text.
    """
    try:
        doc = json.loads(body, parse_constant=_NonFinite, parse_float=_number)
    except json.JSONDecodeError as err:
        return [_not_json(("body", err.pos), err.msg)]
    except UnicodeDecodeError as err:
        return [_not_json(("body",), f"not UTF-8 text: {err.reason} at byte {err.start}")]
    except RecursionError:
        return [_not_json(("body",), "nested too deeply")]
    return [
        {
            "type": "finite_number",
            "loc": ["body", *loc],
            "msg": f"Input should be a finite number, not {text}",
            "input": text,
        }
        for loc, text in _non_finite(doc, ())
    ]


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this ``Content-Type`` as JSON (``application/json``,
    ``application/*+json``, any parameters)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats spelled as JSON would (``"NaN"``, ``"Infinity"``) and
    bytes decoded (invalid UTF-8 replaced), through dicts, lists and tuples."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


async def validation_error(request: Request, exc: Exception) -> Response:
    """FastAPI's 422 for a ``RequestValidationError``, encodable whatever input it echoes."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": jsonable_encoder(json_safe(exc.errors()))}, status_code=422)


def install(app: FastAPI) -> None:
    """Refuse bodies that :func:`body_errors` finds fault with (before routing and
    authentication, as FastAPI does with a body that is not JSON) and make validation errors
    JSON-safe. Install it before the middleware that should wrap its 422 (security headers)."""
    app.add_exception_handler(RequestValidationError, validation_error)

    @app.middleware("http")
    async def refuse_non_json_bodies(request: Request, call_next: Any) -> Response:
        if request.method not in READ_METHODS and is_json(request.headers.get("content-type")):
            body = await request.body()
            errors = body_errors(body) if body else []
            if errors:
                return JSONResponse({"detail": errors}, status_code=422)
        response: Response = await call_next(request)
        return response
