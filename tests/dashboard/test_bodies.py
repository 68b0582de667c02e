"""Malformed request bodies on every mutating route, enumerated from the app itself: each is a
422 in FastAPI's validation-error shape (``detail: [{loc, msg, type}]``) whose JSON any client
can parse, never a 500, and nothing changes. A number JSON cannot carry (``NaN``,
``Infinity``, ``-Infinity``, which Python's json reads, and ``1e999``, which it reads as
infinity) is named by its path in the body (issue 16 finding 6: ``NaN`` in a launch body was a
500 while the validation error echoed it)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient

from dashboard.deps import CSRF_HEADER
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event
from tests.dashboard.conftest import PASSWORD
from tests.dashboard.helpers import count

WITH_BODY = {"POST", "PUT", "PATCH", "DELETE"}
NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999"]
# Bodies no JSON parser should accept (the last two make Python's json raise something other
# than a JSONDecodeError: UnicodeDecodeError, RecursionError).
NOT_JSON = [b'{"a": ', b'{"a": 1,}', b"{'a': 1}", b"\xff\xfe{}", b"[" * 100_000]


def mutating_routes(app: FastAPI) -> list[tuple[str, str, APIRoute]]:
    """(method, path with ids filled in, route) of every API route that takes a body."""
    out: list[tuple[str, str, APIRoute]] = []
    for ctx in iter_route_contexts(app.routes):
        route = ctx.route
        if isinstance(route, APIRoute) and ctx.path and ctx.methods:
            path = re.sub(r"\{[^}]+\}", "1", ctx.path)
            out.extend((m, path, route) for m in sorted(ctx.methods & WITH_BODY))
    return out


def strict_json(text: str) -> Any:
    """``text`` parsed as RFC 8259 JSON (no NaN or Infinity, which browsers refuse)."""

    def refuse(name: str) -> None:
        raise AssertionError(f"response is not JSON: it holds {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def admin(app: FastAPI) -> TestClient:
    """An admin's browser session that reports a server error as a 500 (not by raising)."""
    c = TestClient(app, raise_server_exceptions=False)
    r = c.post("/api/auth/login", json={"username": "admin", "password": PASSWORD})
    assert r.status_code == 200, r.text
    c.headers[CSRF_HEADER] = r.json()["csrf_token"]
    return c


def send(c: TestClient, method: str, path: str, body: bytes, content_type: str | None) -> Any:
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = c.request(method, path, content=body, headers=headers)
    assert r.status_code == 422, (method, path, body[:40], r.status_code, r.text[:300])
    assert r.headers["content-security-policy"] and r.headers["cache-control"] == "no-store"
    detail = strict_json(r.text)["detail"]
    assert detail and all(e["loc"][0] == "body" and e["msg"] for e in detail), detail
    return detail


def first_field(route: APIRoute) -> str:
    """A top-level field of the route's body model ("x" when it takes no body)."""
    if route.body_field is None:
        return "x"
    fields = route.body_field.field_info.annotation.model_fields  # type: ignore[union-attr]
    return next(iter(fields))


def test_every_route_takes_a_body_or_none(app: FastAPI) -> None:
    routes = mutating_routes(app)
    assert len(routes) >= 15 and sum(r.body_field is not None for _, _, r in routes) >= 7
    assert ("POST", "/api/runs") in {(m, p) for m, p, _ in routes}


def test_numbers_json_cannot_carry_are_422_naming_the_field(
    app: FastAPI, admin: TestClient, store: MetadataStore
) -> None:
    before = count(store, Event)
    for method, path, route in mutating_routes(app):
        field = first_field(route)
        for number in NON_FINITE:
            detail = send(
                admin, method, path, b'{"%s": %s}' % (field.encode(), number), "application/json"
            )
            assert [e["loc"] for e in detail] == [["body", field]], (method, path, detail)
            assert number.decode() in detail[0]["msg"]
            nested = b'{"a": [1, {"b": %s}], "c": NaN}' % number
            detail = send(admin, method, path, nested, "application/json; charset=utf-8")
            assert [e["loc"] for e in detail] == [["body", "a", 1, "b"], ["body", "c"]]
    assert count(store, Event) == before


def test_a_launch_with_nan_hyperparameters_names_them(admin: TestClient) -> None:
    from tests.dashboard.helpers import VALID_SPEC

    body = json.dumps({**VALID_SPEC, "hyperparameters": {"batch_size": 64, "lr": float("nan")}})
    detail = send(admin, "POST", "/api/runs", body.encode(), "application/json")
    assert detail[0]["loc"] == ["body", "hyperparameters", "lr"]


def test_bodies_that_are_not_json_are_422(
    app: FastAPI, admin: TestClient, store: MetadataStore
) -> None:
    before = count(store, Event)
    for method, path, _ in mutating_routes(app):
        for body in NOT_JSON:
            send(admin, method, path, body, "application/json")
    assert count(store, Event) == before


def test_bodies_of_the_wrong_shape_or_type_are_422(
    app: FastAPI, admin: TestClient, store: MetadataStore
) -> None:
    before = count(store, Event)
    for method, path, route in mutating_routes(app):
        if route.body_field is None:
            continue  # a body it does not read cannot have the wrong shape
        for body, content_type in [
            (b"[1, 2]", "application/json"),  # a list where an object is expected
            (b'"text"', "application/json"),
            (b"null", "application/json"),
            (b"", "application/json"),
            (b'{"name": "x"}', None),  # no content type
            (b'{"name": "x"}', "text/plain"),
            (b"\xff\xfe\x00", "application/octet-stream"),  # and not text at all
            (b"name=x", "application/x-www-form-urlencoded"),
        ]:
            send(admin, method, path, body, content_type)
    assert count(store, Event) == before
