"""Fleet listing, e-stop/clear/release/retire, enrollment tokens exchanged as a robot would."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlalchemy import select

from robofleet.store.accounts import Role
from robofleet.store.models import Event, Robot, RobotStatus, Run, utcnow
from robofleet.store.store import MetadataStore
from tests.dashboard.helpers import add_robot

Client = Callable[[Role], TestClient]


def test_enroll_shows_command_and_token_works_once(as_role: Client, store: MetadataStore) -> None:
    op = as_role(Role.OPERATOR)
    r = op.post("/api/enrollment-tokens", json={"robot_name": "sawyer-1", "robot_type": "sim"})
    assert r.status_code == 201
    token, command = r.json()["token"], r.json()["command"]
    assert command == (f"robofleet edge --server 127.0.0.1:50051 --token {token} --robot sawyer-1")
    robot, credential = store.consume_enrollment_token(
        token, robot_name="ignored", robot_type="ignored", spec={"fps": 80}
    )
    assert robot.name == "sawyer-1" and credential
    listed = op.get("/api/enrollment-tokens").json()
    assert listed[0]["used_by_robot_id"] == robot.id
    fleet = as_role(Role.VIEWER).get("/api/robots").json()
    assert [(x["name"], x["status"], x["robot_type"]) for x in fleet] == [
        ("sawyer-1", "enrolled", "sim")
    ]
    r = op.post("/api/enrollment-tokens", json={"robot_name": "bad name; rm -rf"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "robot_name"]


def test_fleet_row_fields(as_role: Client, store: MetadataStore) -> None:
    rid = add_robot(store, "r1")
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
        robot = s.get(Robot, rid)
        assert robot is not None
        robot.last_heartbeat_at = utcnow()
        robot.applied_policy_version = 7
        robot.stats = {"control_loop_p99_ms": 4.5}
    store.lease_robots("run-a", [rid])
    row = as_role(Role.VIEWER).get(f"/api/robots/{rid}").json()
    assert row["leased_run_id"] == "run-a" and row["status"] == "leased"
    assert row["applied_policy_version"] == 7 and row["control_loop_p99_ms"] == 4.5
    assert 0 <= row["heartbeat_age_s"] < 60


def test_estop_clear_release_retire(as_role: Client, store: MetadataStore) -> None:
    op, admin = as_role(Role.OPERATOR), as_role(Role.ADMIN)
    rid = add_robot(store, "r1")
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
    store.lease_robots("run-a", [rid])
    assert op.post(f"/api/robots/{rid}/estop").json()["status"] == "estopped"
    assert op.post(f"/api/robots/{rid}/estop").status_code == 200  # idempotent
    r = op.post(f"/api/robots/{rid}/clear-estop")
    assert r.json()["status"] == "idle" and r.json()["leased_run_id"] is None
    assert op.post(f"/api/robots/{rid}/clear-estop").status_code == 409
    assert op.post(f"/api/robots/{rid}/release").status_code == 409  # nothing leased now
    store.lease_robots("run-a", [rid])
    r = op.post(f"/api/robots/{rid}/release")
    assert r.status_code == 200 and r.json()["leased_run_id"] is None
    assert admin.post(f"/api/robots/{rid}/retire").json()["status"] == "retired"
    assert admin.post(f"/api/robots/{rid}/retire").status_code == 409
    with store.session() as s:
        kinds = [e.kind for e in s.scalars(select(Event).where(Event.robot_id == rid))]
        assert s.get(Robot, rid).status == RobotStatus.RETIRED  # type: ignore[union-attr]
    assert kinds.count("robot.estopped") == 2
    assert {"robot.estop_cleared", "lease.released", "robot.retired"} <= set(kinds)


def test_sites(as_role: Client) -> None:
    admin = as_role(Role.ADMIN)
    assert admin.post("/api/sites", json={"name": "lab-a"}).status_code == 201
    assert admin.post("/api/sites", json={"name": "lab-a"}).status_code == 409
    assert [s["name"] for s in as_role(Role.VIEWER).get("/api/sites").json()] == ["lab-a"]


class RecordingControl:
    """comms' ``CloudServer.push_control`` as the dashboard sees it: ``connected`` robots."""

    def __init__(self, connected: set[int]) -> None:
        self.connected = connected
        self.pushed: list[tuple[int, str, str, str]] = []

    def push_control(self, robot_id: int, kind: str, run_id: str = "", reason: str = "") -> bool:
        if robot_id not in self.connected:
            return False
        self.pushed.append((robot_id, kind, run_id, reason))
        return True


def test_rerecord_and_discard_reach_the_robot_running_an_episode(
    settings, store: MetadataStore
) -> None:
    from dashboard.app import create_app
    from robofleet.app.orchestration.manager import QueuedRunManager
    from tests.dashboard.conftest import login

    rid, other = add_robot(store, "r1"), add_robot(store, "r2")
    control = RecordingControl({rid})
    app = create_app(settings, store, QueuedRunManager(store, settings.data_dir), control)
    op = login(app, Role.OPERATOR.value)
    assert op.post(f"/api/robots/{rid}/discard").status_code == 409  # not leased: no episode
    with store.session() as s:
        s.add(Run(id="run-a", algorithm="hg-dagger"))
    store.lease_robots("run-a", [rid, other])
    assert op.post(f"/api/robots/{rid}/rerecord").status_code == 200
    assert op.post(f"/api/robots/{rid}/discard").status_code == 200
    r = op.post(f"/api/robots/{other}/discard")  # leased but not connected here
    assert r.status_code == 409 and "not connected" in r.json()["detail"]
    assert control.pushed == [
        (rid, "rerecord", "run-a", "dashboard: user:operator"),
        (rid, "discard", "run-a", "dashboard: user:operator"),
    ]
    with store.session() as s:
        kinds = [e.kind for e in s.scalars(select(Event).where(Event.robot_id == rid))]
    assert {"robot.episode_rerecord", "robot.episode_discard"} <= set(kinds)
