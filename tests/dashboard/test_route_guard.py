"""Every route is enumerated from the app itself, so a new route cannot escape these checks:
unauthenticated and wrong-role callers, robot credentials, and CSRF-less browser posts are
refused on every mutating route, and nothing changes when they are."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient

from dashboard.deps import CSRF_HEADER
from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event
from tests.dashboard.conftest import login
from tests.dashboard.helpers import count

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
# The one route anyone may call: it is how a person gets a session.
PUBLIC_MUTATING = {("POST", "/api/auth/login")}
PUBLIC_GET = {"/healthz", "/login"}

# Minimum role of every mutating route. A route missing here fails test_table_is_complete.
EXPECTED_ROLE: dict[tuple[str, str], Role] = {
    ("POST", "/api/auth/logout"): Role.VIEWER,
    ("POST", "/api/auth/password"): Role.VIEWER,
    ("POST", "/api/tokens"): Role.VIEWER,
    ("DELETE", "/api/tokens/{token_id}"): Role.VIEWER,
    ("POST", "/api/users"): Role.ADMIN,
    ("PATCH", "/api/users/{user_id}"): Role.ADMIN,
    ("POST", "/api/robots/{robot_id}/estop"): Role.OPERATOR,
    ("POST", "/api/robots/{robot_id}/clear-estop"): Role.OPERATOR,
    ("POST", "/api/robots/{robot_id}/rerecord"): Role.OPERATOR,
    ("POST", "/api/robots/{robot_id}/discard"): Role.OPERATOR,
    ("POST", "/api/robots/{robot_id}/ready"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/help/{request_id}/answer"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/help/take"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/help/done"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/episodes/{robot_id}/{episode_index}/label"): Role.OPERATOR,
    ("POST", "/api/robots/{robot_id}/release"): Role.OPERATOR,
    ("POST", "/api/station/robots/{robot_id}/command"): Role.OPERATOR,
    ("POST", "/api/station/robots/{robot_id}/resume"): Role.OPERATOR,
    ("POST", "/api/robots/{robot_id}/retire"): Role.ADMIN,
    ("POST", "/api/sites"): Role.ADMIN,
    ("POST", "/api/enrollment-tokens"): Role.OPERATOR,
    ("POST", "/api/runs"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/stop"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/pause"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/resume"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/checkpoint"): Role.OPERATOR,
    ("POST", "/api/policy-versions/{version_id}/promote"): Role.OPERATOR,
}


def routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every HTTP route, including those of included routers."""
    out: list[tuple[str, str]] = []
    for ctx in iter_route_contexts(app.routes):
        methods, path = ctx.methods, ctx.path
        if methods and path and not path.startswith("/static"):
            out.extend((m, path) for m in sorted(methods) if m != "HEAD")
    return out


def test_enumeration_sees_every_documented_operation(app: FastAPI) -> None:
    documented = {
        (method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops
    }
    assert documented and documented <= set(routes(app))
    assert ("GET", "/runs/{run_id}") in routes(app)  # pages too, though not documented


def concrete(path: str) -> str:
    """Fill path parameters with ids that exist in no table (auth must refuse before lookup)."""
    return re.sub(r"\{[^}]+\}", "1", path)


def mutating(app: FastAPI) -> list[tuple[str, str]]:
    return [(m, p) for m, p in routes(app) if m in MUTATING and (m, p) not in PUBLIC_MUTATING]


def test_table_is_complete(app: FastAPI) -> None:
    assert set(mutating(app)) == set(EXPECTED_ROLE)


def test_unauthenticated_refused_everywhere(app: FastAPI, store: MetadataStore) -> None:
    before = count(store, Event)
    with TestClient(app) as anon:
        for method, path in routes(app):
            if path in PUBLIC_GET or (method, path) in PUBLIC_MUTATING:
                continue
            r = anon.request(method, concrete(path))
            if path.startswith("/api/") or path == "/metrics":
                assert r.status_code == 401, (method, path, r.status_code)
            else:  # pages send people to the log-in form
                r = anon.request(method, concrete(path), follow_redirects=False)
                assert r.status_code == 303 and r.headers["location"].startswith("/login"), path
    assert count(store, Event) == before


@pytest.mark.parametrize("role", [Role.VIEWER, Role.OPERATOR])
def test_wrong_role_refused(app: FastAPI, store: MetadataStore, role: Role) -> None:
    client = login(app, role.value)
    before = count(store, Event)
    checked = 0
    for (method, path), needed in EXPECTED_ROLE.items():
        if role.rank >= needed.rank:
            continue
        r = client.request(method, concrete(path), json={})
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        assert needed.value in r.json()["detail"]
        checked += 1
    assert checked > 0
    assert count(store, Event) == before + 0


def test_robot_credential_refused_everywhere(app: FastAPI, store: MetadataStore) -> None:
    token = store.create_enrollment_token(timedelta(minutes=5))
    _, credential = store.consume_enrollment_token(
        token, robot_name="r1", robot_type="metaworld-sawyer", spec={}
    )
    before = count(store, Event)
    with TestClient(app) as c:
        for method, path in routes(app):
            if path in PUBLIC_GET or not (path.startswith("/api/") or path == "/metrics"):
                continue
            r = c.request(
                method, concrete(path), headers={"Authorization": f"Bearer {credential}"}, json={}
            )
            if (method, path) in PUBLIC_MUTATING:
                continue  # log-in takes a username and password, never a bearer token
            assert r.status_code == 403, (method, path, r.status_code)
            assert "robot credentials" in r.json()["detail"]
    assert count(store, Event) == before


def test_session_without_csrf_refused_on_every_mutating_route(
    app: FastAPI, store: MetadataStore
) -> None:
    admin = login(app, "admin")
    del admin.headers[CSRF_HEADER]
    before = count(store, Event)
    for method, path in mutating(app):
        r = admin.request(method, concrete(path), json={})
        assert r.status_code == 403, (method, path)
        assert "CSRF" in r.json()["detail"]
        r = admin.request(method, concrete(path), json={}, headers={CSRF_HEADER: "0" * 64})
        assert r.status_code == 403, (method, path)
    assert count(store, Event) == before
