"""OpenAPI completeness, local-only assets, the latest migrations, and `robofleet dashboard`."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import inspect

import foundation.store.metadata_store  # noqa: F401  (registers every table on Base.metadata)
from dashboard.app import CSP
from foundation.store.metadata_store import alembic_config, current_revision, make_engine, upgrade
from foundation.store.models import Base
from tests.dashboard.conftest import login

REPO = Path(__file__).resolve().parents[2]


def test_openapi_documents_every_api_operation(app: FastAPI) -> None:
    schema = app.openapi()
    ops = [(m, p, op) for p, d in schema["paths"].items() for m, op in d.items()]
    assert len(ops) >= 30
    for method, path, op in ops:
        assert op.get("summary"), (method, path)
        assert op.get("tags"), (method, path)
        if path not in ("/healthz", "/api/auth/login"):
            assert "401" in op["responses"], (method, path)
    launch = schema["paths"]["/api/runs"]["post"]
    assert "422" in launch["responses"]
    spec = schema["components"]["schemas"]["RunSpec"]
    assert {"name", "algorithm", "tasks", "robots", "policy", "hyperparameters"} <= set(
        spec["properties"]
    )


def test_openapi_document_needs_a_viewer(app: FastAPI, anon: TestClient) -> None:
    assert anon.get("/api/openapi.json").status_code == 401
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        assert anon.get(path, follow_redirects=False).status_code == 404, path
    r = login(app, "viewer").get("/api/openapi.json")
    assert r.status_code == 200
    assert "RunSpec" in r.json()["components"]["schemas"]
    assert "/api/runs" in r.json()["paths"]


def test_pages_load_only_local_assets(anon: TestClient) -> None:
    html = anon.get("/login").text
    assert anon.get("/login").headers["content-security-policy"] == CSP
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all(r.startswith("/") and not r.startswith("//") for r in refs), refs
    for asset in ("/static/app.js", "/static/charts.js", "/static/app.css"):
        body = anon.get(asset).text
        assert anon.get(asset).status_code == 200
        assert "http://" not in body and "https://" not in body, asset


def test_latest_migrations_match_models_and_downgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    upgrade(url)
    assert current_revision(url) == "0006"
    engine = make_engine(url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    command.downgrade(alembic_config(url), "0004")  # 0005: robots' help requests
    with engine.connect() as conn:
        assert "help_requests" not in inspect(conn).get_table_names()
    command.downgrade(alembic_config(url), "0003")  # 0004: tokens give their tags to robots
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("enrollment_tokens")}
    assert "tags" not in columns and "robot_type" in columns
    command.downgrade(alembic_config(url), "0002")
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
    assert not {"users", "api_tokens", "metrics"} & tables and "runs" in tables
    engine.dispose()
    upgrade(url)
    assert current_revision(url) == "0006"


def _dashboard_env(tmp_path: Path) -> dict[str, str]:
    return {
        "ROBOFLEET_DATA_DIR": str(tmp_path / "data"),
        "ROBOFLEET_SECRET_KEY": "k" * 40,
        # `robofleet dashboard --port 0` is refused by the top-level parser (reported to the
        # lead: argparse.REMAINDER does not take leading options), so the port comes from env.
        "ROBOFLEET_DASHBOARD__PORT": "0",
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
    }


def _start_dashboard(env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str]]:
    """``robofleet dashboard`` with ``env``; returns once it printed where it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "robofleet.cli", "dashboard"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"exited early: {''.join(lines)}"
        lines.append(line)
        if "serving on" in line:
            return proc, lines
    proc.kill()
    raise AssertionError("".join(lines))


def test_robofleet_dashboard_serves_and_prints_admin_once(tmp_path: Path) -> None:
    env = _dashboard_env(tmp_path)

    def start() -> tuple[subprocess.Popen[str], list[str]]:
        return _start_dashboard(env)

    proc, lines = start()
    try:
        out = "".join(lines)
        url = re.search(r"serving on (http://127\.0\.0\.1:(\d+))/", out)
        password = re.search(r"password: (\S+)", out)
        assert url and password, out
        # The printed address takes connections at once: with the server frozen right after the
        # line, a connection still completes (it waits in the listen backlog, not refused).
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            socket.create_connection(("127.0.0.1", int(url.group(2))), timeout=5).close()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        with httpx.Client(base_url=url.group(1), timeout=10) as c:
            assert c.get("/healthz").json() == {"status": "ok"}
            r = c.post("/api/auth/login", json={"username": "admin", "password": password.group(1)})
            assert r.status_code == 200 and r.json()["role"] == "admin"
            # No proxy is trusted by default: a rotating X-Forwarded-For is one client.
            codes = [
                c.post(
                    "/api/auth/login",
                    json={"username": "admin", "password": "guess"},
                    headers={"X-Forwarded-For": f"198.51.100.{i}"},
                ).status_code
                for i in range(6)
            ]
            assert codes == [401] * 5 + [429], codes
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    proc, lines = start()
    proc.terminate()
    proc.wait(timeout=20)
    assert "password:" not in "".join(lines)  # printed on the first start only


def test_sigterm_stops_robofleet_dashboard_with_one_line_and_exit_0(tmp_path: Path) -> None:
    """A service manager's SIGTERM (and Ctrl-C) is a clean stop: one line, exit code 0."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc, _ = _start_dashboard(_dashboard_env(tmp_path))
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, (sig, proc.returncode, rest)
        assert rest == "robofleet dashboard: stopped\n", rest
