"""Live metric stream (Server-Sent Events over a real uvicorn) and the Prometheus endpoint."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
from fastapi.testclient import TestClient

from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.metrics import insert_metrics
from foundation.store.models import Robot, Run, RunState, utcnow
from tests.dashboard.conftest import PASSWORD, LiveServer
from tests.dashboard.helpers import add_robot

Client = Callable[[Role], TestClient]


def _read_events(lines: object, want: Callable[[list[tuple[str, object]]], bool]) -> list:  # type: ignore[type-arg]
    events: list[tuple[str, object]] = []
    kind, data = "", ""
    deadline = time.monotonic() + 15
    for line in lines:  # type: ignore[attr-defined]
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and kind:
            events.append((kind, json.loads(data)))
            kind = ""
            if want(events):
                return events
        assert time.monotonic() < deadline, events
    return events


def test_stream_sends_backlog_then_new_points_and_state(live_server: LiveServer) -> None:
    store = live_server.store
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger", state=RunState.RUNNING))
    insert_metrics(store, "run-a", [{"name": "loss", "step": 1, "value": 0.9}])
    with httpx.Client(base_url=live_server.url, timeout=20) as c:
        r = c.post("/api/auth/login", json={"username": "viewer", "password": PASSWORD})
        assert r.status_code == 200
        assert c.get("/api/runs/nope/stream").status_code == 404
        with c.stream("GET", "/api/runs/run-a/stream") as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = resp.iter_lines()
            first = _read_events(lines, lambda ev: len(ev) >= 2)
            assert first[0] == ("run", first[0][1]) and first[0][1]["state"] == "running"  # type: ignore[index]
            assert [p["value"] for p in first[1][1]] == [0.9]  # type: ignore[union-attr]
            insert_metrics(
                store,
                "run-a",
                [
                    {"name": "success_rate", "step": 2, "value": 0.5, "task": "reach-v3"},
                    {"name": "loss", "step": 2, "value": 0.7},
                ],
            )
            with store.session() as s:
                run = s.get(Run, "run-a")
                assert run is not None
                run.state = RunState.PAUSED
            more = _read_events(
                lines, lambda ev: {k for k, _ in ev} == {"run", "metrics"} and len(ev) >= 2
            )
    got = {k: d for k, d in more}
    assert got["run"]["state"] == "paused"  # type: ignore[index]
    assert [(p["name"], p["task"], p["step"]) for p in got["metrics"]] == [  # type: ignore[union-attr]
        ("success_rate", "reach-v3", 2),
        ("loss", None, 2),
    ]


def test_stream_resumes_after_last_event_id(live_server: LiveServer) -> None:
    store = live_server.store
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="sac", state=RunState.RUNNING))
    insert_metrics(store, "run-a", [{"name": "loss", "step": i, "value": i} for i in range(5)])
    with httpx.Client(base_url=live_server.url, timeout=20) as c:
        c.post("/api/auth/login", json={"username": "viewer", "password": PASSWORD})
        all_points = c.get("/api/runs/run-a/metrics").json()
        third = all_points[2]["id"]
        with c.stream(
            "GET", "/api/runs/run-a/stream", headers={"Last-Event-ID": str(third)}
        ) as resp:
            ev = _read_events(resp.iter_lines(), lambda e: any(k == "metrics" for k, _ in e))
    points = next(d for k, d in ev if k == "metrics")
    assert [p["step"] for p in points] == [3, 4]  # type: ignore[union-attr]


def test_prometheus_fleet_buffer_learner(as_role: Client, store: MetadataStore) -> None:
    rid = add_robot(store, "r1")
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger", state=RunState.RUNNING))
        s.add(Run(id="run-old", algorithm="hg-dagger", state=RunState.FINISHED))
        robot = s.get(Robot, rid)
        assert robot is not None
        robot.last_heartbeat_at = utcnow()
        robot.stats = {"control_loop_p99_ms": 3.25}
    store.lease_robots("run-a", [rid])
    insert_metrics(
        store,
        "run-a",
        [
            {"name": "buffer_size", "step": 1, "value": 100},
            {"name": "buffer_size", "step": 2, "value": 250},
            {"name": "buffer_robot_steps", "step": 2, "value": 150},
            {"name": "buffer_offline_steps", "step": 2, "value": 100},
            {"name": "learner_updates_per_s", "step": 2, "value": 41.5},
            {"name": "success_rate", "step": 2, "value": 0.75, "task": "reach-v3"},
            {"name": "policy_version", "step": 2, "value": 3, "robot_id": rid},
        ],
    )
    insert_metrics(store, "run-old", [{"name": "buffer_size", "step": 9, "value": 999}])
    text = as_role(Role.VIEWER).get("/metrics").text
    assert 'robofleet_robots{status="leased"} 1.0' in text
    assert "robofleet_leases_active 1.0" in text
    assert 'robofleet_runs{state="running"} 1.0' in text
    assert 'robofleet_buffer_transitions{robot="",run="run-a",task=""} 250.0' in text
    assert 'robofleet_buffer_robot_steps{robot="",run="run-a",task=""} 150.0' in text
    assert 'robofleet_buffer_offline_steps{robot="",run="run-a",task=""} 100.0' in text
    assert 'robofleet_learner_updates_per_second{robot="",run="run-a",task=""} 41.5' in text
    assert 'robofleet_run_success_rate{robot="",run="run-a",task="reach-v3"} 0.75' in text
    assert 'robofleet_robot_policy_version{robot="r1",run="run-a",task=""} 3.0' in text
    assert 'robofleet_robot_control_loop_p99_ms{robot="r1"} 3.25' in text
    # Finished runs are not exported: no series names run-old and its value appears nowhere.
    assert 'run="run-old"' not in text
    assert not any(line.endswith(" 999.0") for line in text.splitlines())
