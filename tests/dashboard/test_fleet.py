"""Fleet listing, e-stop/clear/release/retire, enrollment tokens exchanged as a robot would."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlalchemy import select

from comms.cloud.enrollment_tokens import edge_command
from foundation.store.accounts import Role
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Event, Robot, RobotStatus, Run, utcnow
from tests.dashboard.helpers import add_robot

Client = Callable[[Role], TestClient]


def test_enroll_shows_command_and_token_works_once(as_role: Client, store: MetadataStore) -> None:
    op = as_role(Role.OPERATOR)
    r = op.post("/api/enrollment-tokens", json={"robot_name": "sawyer-1", "robot_type": "sim"})
    assert r.status_code == 201
    token, command = r.json()["token"], r.json()["command"]
    assert command == (f"robofleet edge --server 127.0.0.1:50051 --token={token} --robot sawyer-1")
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


def test_enroll_with_tags_driver_and_operator_shows_the_edge_command(
    as_role: Client, store: MetadataStore
) -> None:
    """The Enroll endpoint and ``robofleet robots enroll`` print one command line
    (comms.cloud.enrollment_tokens.edge_command): driver, its options and the operator, no run id."""
    op = as_role(Role.OPERATOR)
    options = {"env_id": "gym_hil/PandaPickCubeBase-v0", "env_kwargs": {"x": 1}}
    body = {
        "robot_name": "panda-1",
        "robot_type": "gym-hil-panda",
        "tags": {"site": "lab-a"},
        "driver": "gymnasium",
        "driver_options": options,
        "operator": "lerobot",
        "operator_options": {"type": "so101_leader", "port": "/dev/ttyACM0"},
    }
    r = op.post("/api/enrollment-tokens", json=body)
    assert r.status_code == 201, r.text
    token, command = r.json()["token"], r.json()["command"]
    assert command == edge_command(
        "127.0.0.1:50051",
        token,
        "panda-1",
        driver="gymnasium",
        driver_options=options,
        operator="lerobot",
        operator_options={"type": "so101_leader", "port": "/dev/ttyACM0"},
    )
    assert "--run" not in command
    assert op.get("/api/enrollment-tokens").json()[0]["tags"] == {"site": "lab-a"}
    robot, _ = store.consume_enrollment_token(token, robot_name="x", robot_type="x", spec={})
    assert robot.tags == {"site": "lab-a"} and robot.robot_type == "gym-hil-panda"
    for bad, loc in [
        ({"driver_options": {"a=b": 1}}, ["body", "driver_options", "a=b", "[key]"]),
        ({"tags": {"bad key": "v"}}, ["body", "tags", "bad key", "[key]"]),
        ({"driver": "Meta World"}, ["body", "driver"]),
        ({"operator": "--run"}, ["body", "operator"]),
        ({"operator_options": {"type": "so101_leader"}}, ["body"]),
    ]:
        r = op.post("/api/enrollment-tokens", json=bad)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, (bad, r.text)
    # A lab's own driver (hal.drivers plugin), installed on its robot computer only.
    r = op.post("/api/enrollment-tokens", json={"driver": "my_pkg.arms:MyArm"})
    assert r.status_code == 201 and "--driver my_pkg.arms:MyArm" in r.json()["command"], r.text


SPEC = {
    "robot_type": "gym-hil-panda",
    "observation_features": {
        "observation.state": {"dtype": "float32", "shape": [18], "names": None},
        "observation.images.front": {"dtype": "video", "shape": [128, 128, 3], "names": None},
    },
    "action_features": {"action": {"dtype": "float32", "shape": [4], "names": None}},
    "control_hz": 10.0,
    "cameras": [{"name": "front", "height": 128, "width": 128, "channels": 3}],
    "computer": {"driver": "gymnasium", "operator": "keyboard"},
}


def _robot(store: MetadataStore, name: str, status: RobotStatus, **fields: object) -> int:
    rid = add_robot(store, name, status)
    with store.session() as s:
        robot = s.get(Robot, rid)
        assert robot is not None
        for key, value in fields.items():
            setattr(robot, key, value)
    return rid


def test_fleet_shows_what_each_robot_does_and_is(as_role: Client, store: MetadataStore) -> None:
    with store.session() as s:
        s.add_all([Run(id="run-a", algorithm="hg-dagger"), Run(id="run-b", algorithm="sac")])
    beat = {"last_heartbeat_at": utcnow()}
    _robot(store, "a-idle", RobotStatus.IDLE, stats={"state": "idle", "run_id": "run-b"}, **beat)
    acting = _robot(
        store,
        "b-acting",
        RobotStatus.LEASED,
        stats={"state": "paused", "run_id": "run-a"},
        spec=SPEC,
        **beat,
    )
    leased = _robot(store, "c-leased", RobotStatus.IDLE, stats={"state": "idle", "run_id": ""})
    _robot(
        store,
        "d-refused",
        RobotStatus.IDLE,
        stats={"state": "refused", "run_id": "run-b", "refused": "action: 7 != 4"},
    )
    _robot(store, "e-offline", RobotStatus.OFFLINE, stats={"state": "running", "run_id": "run-a"})
    _robot(store, "f-estop", RobotStatus.ESTOPPED, stats={"state": "estopped", "run_id": "run-a"})
    _robot(store, "g-new", RobotStatus.ENROLLED, spec={"fps": 80})
    store.lease_robots("run-a", [acting, leased])
    viewer = as_role(Role.VIEWER)
    rows = {r["name"]: r for r in viewer.get("/api/robots").json()}
    got = {n: {k: v for k, v in r["activity"].items() if v is not None} for n, r in rows.items()}
    assert got == {
        "a-idle": {"state": "idle"},  # its last run is no longer its run
        "b-acting": {"state": "assigned", "run_id": "run-a", "run_state": "paused"},
        "c-leased": {"state": "leased", "run_id": "run-a"},
        "d-refused": {"state": "refused", "run_id": "run-b", "reason": "action: 7 != 4"},
        "e-offline": {"state": "offline"},
        "f-estop": {"state": "estopped", "run_id": "run-a", "run_state": "estopped"},
        "g-new": {"state": "enrolled"},
    }
    assert rows["b-acting"]["spec_summary"] == {
        "observation": {"observation.state": [18], "observation.images.front": [128, 128, 3]},
        "action": [4],
        "cameras": [{"name": "front", "height": 128, "width": 128}],
        "control_hz": 10.0,
        "driver": "gymnasium",
        "operator": "keyboard",
    }
    assert rows["g-new"]["spec_summary"] == {
        "observation": {},
        "action": None,
        "cameras": [],
        "control_hz": None,
        "driver": None,
        "operator": None,
    }

    def names(query: str) -> list[str]:
        r = viewer.get(f"/api/robots?{query}")
        assert r.status_code == 200, r.text
        return [x["name"] for x in r.json()]

    assert names("run_id=run-a") == ["b-acting", "c-leased", "f-estop"]
    assert names("state=refused") == ["d-refused"]
    assert names("state=assigned&run_id=run-b") == []
    assert names("robot_type=other") == []
    assert viewer.get("/api/robots?state=dancing").status_code == 422


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
    from runs.manager import QueuedRunManager
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
