"""Fixtures: a migrated store, the app, logged-in clients per role, a live uvicorn server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dashboard.accounts import create_user
from dashboard.app import create_app
from dashboard.config import DashboardSettings
from dashboard.deps import CSRF_HEADER
from dashboard.serve import uvicorn_config
from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore, upgrade
from robofleet.settings import Settings
from runs.episode_view import RunEpisodes
from runs.manager import QueuedRunManager
from tests.fakes.settings import fast_settings

PASSWORD = "correct horse battery"
ROLES = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)


def make_settings(data_dir: Path, db_url: str) -> Settings:
    return fast_settings(data_dir, database_url=db_url)


@pytest.fixture
def store(db_url: str) -> Iterator[MetadataStore]:
    upgrade(db_url)
    s = MetadataStore(db_url)
    for role in ROLES:
        create_user(s, role.value, PASSWORD, role, actor="test")
    yield s
    s.close()


@pytest.fixture
def settings(tmp_path: Path, store: MetadataStore) -> Settings:
    return make_settings(tmp_path / "data", store.url)


@pytest.fixture
def app(settings: Settings, store: MetadataStore) -> FastAPI:
    return create_app(settings, store, QueuedRunManager(store, settings.data_dir))


@pytest.fixture
def anon(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def login(app: FastAPI, username: str, password: str = PASSWORD) -> TestClient:
    """A client with the session cookie and the CSRF header of a fresh login."""
    c = TestClient(app)
    r = c.post("/api/auth/login", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    c.headers[CSRF_HEADER] = r.json()["csrf_token"]
    return c


@pytest.fixture
def as_role(app: FastAPI) -> Callable[[Role], TestClient]:
    clients: dict[Role, TestClient] = {}

    def get(role: Role) -> TestClient:
        if role not in clients:
            clients[role] = login(app, role.value)
        return clients[role]

    return get


@dataclass
class LiveServer:
    url: str
    app: FastAPI
    store: MetadataStore


@contextmanager
def serve_live(tmp_path: Path, **dashboard: Any) -> Iterator[LiveServer]:
    """uvicorn on 127.0.0.1 (a free port) in a thread, over SQLite; ``dashboard`` overrides
    keys of the dashboard settings (``trusted_proxies=["127.0.0.1"]``)."""
    url = f"sqlite:///{tmp_path}/live.db"
    upgrade(url)
    st = MetadataStore(url)
    for role in ROLES:
        create_user(st, role.value, PASSWORD, role, actor="test")
    settings = make_settings(tmp_path / "data", url)
    settings.dashboard = DashboardSettings.model_validate(
        {**settings.dashboard.model_dump(), **dashboard}
    )
    app = create_app(settings, st, QueuedRunManager(st, settings.data_dir), episodes=RunEpisodes())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn_config(app, settings.dashboard, log_level="warning", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", app, st)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        st.close()


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    """The dashboard served by uvicorn with its default settings (:func:`serve_live`)."""
    with serve_live(tmp_path) as server:
        yield server
