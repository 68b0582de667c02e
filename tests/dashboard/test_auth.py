"""Log-in, sessions, API tokens, CSRF, bootstrap admin, user management."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import select

from dashboard.accounts import ensure_bootstrap_admin
from dashboard.config import DashboardSettings
from dashboard.security import hash_password, verify_password
from foundation.store.accounts import ApiToken, Role, User
from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Event
from tests.dashboard.conftest import PASSWORD, LiveServer, login, serve_live


def _kinds(store: MetadataStore) -> list[str]:
    with store.session() as s:
        return list(s.scalars(select(Event.kind).order_by(Event.id)))


def test_password_hash_is_salted_scrypt() -> None:
    a, b = hash_password("s3cret-password"), hash_password("s3cret-password")
    assert a != b and a.startswith("scrypt$") and "s3cret" not in a
    assert verify_password("s3cret-password", a)
    assert not verify_password("s3cret-passworD", a)
    assert not verify_password("x", "garbage")


def test_bootstrap_admin_created_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/b.db"
    upgrade(url)
    store = MetadataStore(url)
    created = ensure_bootstrap_admin(store)
    assert created is not None
    user, password = created
    assert ensure_bootstrap_admin(store) is None
    with store.session() as s:
        admin = s.scalar(select(User).where(User.username == user))
        assert admin is not None and admin.role == Role.ADMIN
        assert password not in admin.password_hash
    assert _kinds(store) == ["user.bootstrapped"]
    store.close()


def test_login_logout_and_wrong_password(app: FastAPI, store: MetadataStore) -> None:
    with TestClient(app) as c:
        r = c.post("/api/auth/login", json={"username": "viewer", "password": "wrong-password"})
        assert r.status_code == 401 and "wrong username or password" in r.json()["detail"]
        r = c.post("/api/auth/login", json={"username": "nobody", "password": PASSWORD})
        assert r.status_code == 401
        assert c.get("/api/auth/me").status_code == 401
    client = login(app, "operator")
    me = client.get("/api/auth/me").json()
    assert me["username"] == "operator" and me["role"] == "operator" and me["csrf_token"]
    assert client.post("/api/auth/logout").status_code == 200
    assert client.get("/api/auth/me").status_code == 401
    kinds = _kinds(store)
    assert kinds.count("user.login_failed") == 2
    assert "user.login" in kinds and "session_token.revoked" in kinds


def test_logged_out_session_cookie_is_dead_even_if_replayed(app: FastAPI) -> None:
    client = login(app, "viewer")
    cookie = client.cookies.get("robofleet_session")
    client.post("/api/auth/logout")
    with TestClient(app, cookies={"robofleet_session": cookie}) as replay:
        assert replay.get("/api/robots").status_code == 401


def test_api_token_lifecycle(app: FastAPI, store: MetadataStore) -> None:
    op = login(app, "operator")
    r = op.post("/api/tokens", json={"name": "ci"})
    assert r.status_code == 201
    token, token_id = r.json()["token"], r.json()["id"]
    with store.session() as s:
        stored = s.get(ApiToken, token_id)
        assert stored is not None and token not in stored.token_hash
    with TestClient(app) as script:
        auth = {"Authorization": f"Bearer {token}"}
        # Bearer tokens need no CSRF header: browsers never attach them by themselves.
        r = script.post("/api/enrollment-tokens", json={}, headers=auth)
        assert r.status_code == 201
        assert script.post("/api/users", json={}, headers=auth).status_code == 403
        assert (
            script.get("/api/robots", headers={"Authorization": "Bearer nope"}).status_code == 401
        )
        assert (
            script.get("/api/robots", headers={"Authorization": f"Basic {token}"}).status_code
            == 401
        )
        assert op.delete(f"/api/tokens/{token_id}").json()["revoked_at"] is not None
        assert script.get("/api/robots", headers=auth).status_code == 401
    # Someone else's token id is 404, not a way to revoke it.
    r = login(app, "viewer").delete(f"/api/tokens/{token_id}")
    assert r.status_code == 404


def test_admin_manages_users_and_last_admin_is_kept(app: FastAPI, store: MetadataStore) -> None:
    admin = login(app, "admin")
    r = admin.post("/api/users", json={"username": "ana", "password": "short", "role": "operator"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "password"]
    r = admin.post("/api/users", json={"username": "ana", "password": PASSWORD, "role": "boss"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "role"]
    r = admin.post("/api/users", json={"username": "ana", "password": PASSWORD, "role": "operator"})
    assert r.status_code == 201
    ana_id = r.json()["id"]
    r = admin.post("/api/users", json={"username": "ana", "password": PASSWORD, "role": "viewer"})
    assert r.status_code == 409
    ana = login(app, "ana")
    assert admin.patch(f"/api/users/{ana_id}", json={"disabled": True}).status_code == 200
    assert ana.get("/api/auth/me").status_code == 401  # sessions of a disabled user end
    with store.session() as s:
        admin_id = s.scalar(select(User.id).where(User.username == "admin"))
    r = admin.patch(f"/api/users/{admin_id}", json={"role": "viewer"})
    assert r.status_code == 409 and "last admin" in r.json()["detail"]
    assert admin.patch("/api/users/9999", json={"disabled": True}).status_code == 404
    assert "user.created" in _kinds(store) and "user.updated" in _kinds(store)


def test_change_password(app: FastAPI) -> None:
    viewer = login(app, "viewer")
    r = viewer.post(
        "/api/auth/password", json={"current_password": "wrong", "new_password": "x" * 12}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "current_password"]
    r = viewer.post(
        "/api/auth/password", json={"current_password": PASSWORD, "new_password": "new-pass-123"}
    )
    assert r.status_code == 200
    login(app, "viewer", "new-pass-123")
    with TestClient(app) as c:
        r = c.post("/api/auth/login", json={"username": "viewer", "password": PASSWORD})
        assert r.status_code == 401


def test_password_guessing_is_throttled_without_locking_out_the_account(
    app: FastAPI, store: MetadataStore
) -> None:
    with TestClient(app) as c:
        for _ in range(5):  # dashboard.login_max_failures
            r = c.post("/api/auth/login", json={"username": "viewer", "password": "guess"})
            assert r.status_code == 401
        # Now even the right password is not checked from this client for this user.
        r = c.post("/api/auth/login", json={"username": "viewer", "password": PASSWORD})
        assert r.status_code == 429 and "too many failed logins" in r.json()["detail"]
        assert 1 <= int(r.headers["Retry-After"]) <= 300
        # Another user from the same client is below the per-client limit.
        r = c.post("/api/auth/login", json={"username": "operator", "password": PASSWORD})
        assert r.status_code == 200
    kinds = _kinds(store)
    assert kinds.count("user.login_failed") == 5 and kinds.count("user.login_throttled") == 1


def test_throttle_window_slides_and_the_per_client_limit_spans_usernames(app: FastAPI) -> None:
    from dashboard.login_throttle import LoginThrottle

    now = [1000.0]
    app.state.login_throttle = LoginThrottle(2, 3, 60.0, clock=lambda: now[0])

    def attempt(c: TestClient, user: str, password: str = "guess") -> int:
        r = c.post("/api/auth/login", json={"username": user, "password": password})
        return r.status_code

    with TestClient(app) as c:
        assert [attempt(c, "viewer"), attempt(c, "viewer")] == [401, 401]
        assert attempt(c, "viewer", PASSWORD) == 429
        now[0] += 61  # both failures left the window
        assert attempt(c, "viewer", PASSWORD) == 200
        # The success cleared the user's failures; one more failure is one of two again.
        assert attempt(c, "viewer") == 401 and attempt(c, "viewer", PASSWORD) == 200
        # Three failures across usernames reach the per-client limit for every username.
        assert [attempt(c, "a"), attempt(c, "b")] == [401, 401]
        assert attempt(c, "operator", PASSWORD) == 429


def test_throttle_tracks_a_bounded_number_of_keys() -> None:
    from dashboard.login_throttle import LoginThrottle

    t = LoginThrottle(1, 100, 60.0, max_keys=10)
    for i in range(100):
        t.failed(f"10.0.0.{i}", "admin")
    assert len(t._failures) == 10
    assert t.retry_after("10.0.0.99", "admin") is not None  # the newest are kept
    assert t.retry_after("10.0.0.0", "admin") is None


def _guess(c: httpx.Client, user: str, forwarded_for: str, password: str = "guess") -> int:
    r = c.post(
        "/api/auth/login",
        json={"username": user, "password": password},
        headers={"X-Forwarded-For": forwarded_for},
    )
    return r.status_code


def test_a_rotating_forwarded_for_does_not_bypass_the_throttle(live_server: LiveServer) -> None:
    """Issue 16 finding 5: uvicorn's defaults trusted X-Forwarded-For from 127.0.0.1, so a
    guesser on this host got a fresh throttle key per request. Without trusted proxies the
    header is ignored: the socket's address is the client."""
    with httpx.Client(base_url=live_server.url, timeout=10) as c:
        codes = [_guess(c, "viewer", f"198.51.100.{i}") for i in range(6)]
        assert codes == [401] * 5 + [429]  # dashboard.login_max_failures
        assert _guess(c, "viewer", "198.51.100.77", PASSWORD) == 429
        # 20 failures (dashboard.login_max_failures_per_client) across usernames: every
        # username is refused from this address, whatever the header says.
        codes = [_guess(c, f"user{i}", f"203.0.113.{i}") for i in range(15)]
        assert codes == [401] * 15
        assert _guess(c, "operator", "203.0.113.99", PASSWORD) == 429
    with live_server.store.session() as s:
        clients = {e.data["client"] for e in s.scalars(select(Event)) if "client" in e.data}
    assert clients == {"127.0.0.1"}


def test_a_trusted_proxy_forwards_the_client_address(tmp_path: Path) -> None:
    """With ``dashboard.trusted_proxies`` naming the proxy (here this host), the throttle keys
    on the address the proxy forwards; a client cannot escape it by prepending addresses of
    its own (the rightmost untrusted address counts)."""
    with (
        serve_live(tmp_path, trusted_proxies=["127.0.0.1"]) as server,
        httpx.Client(base_url=server.url, timeout=10) as c,
    ):
        codes = [_guess(c, "viewer", f"10.9.9.{i}, 198.51.100.7") for i in range(6)]
        assert codes == [401] * 5 + [429]
        assert _guess(c, "viewer", "198.51.100.8", PASSWORD) == 200  # another client
        with server.store.session() as s:
            events = list(s.scalars(select(Event).where(Event.kind == "user.login_throttled")))
        assert [e.data["client"] for e in events] == ["198.51.100.7"]


def test_trusted_proxies_are_addresses_or_networks() -> None:
    d = DashboardSettings(trusted_proxies=["10.0.0.1", "10.1.0.0/16", "fd00::/8"])
    assert d.trusted_proxies == ["10.0.0.1", "10.1.0.0/16", "fd00::/8"]
    assert DashboardSettings().trusted_proxies == []
    for bad in ("*", "proxy.example.org", "10.1.0.1/16"):
        with pytest.raises(ValidationError, match="trusted_proxies"):
            DashboardSettings(trusted_proxies=[bad])
