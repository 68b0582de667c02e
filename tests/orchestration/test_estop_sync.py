"""EstopSync over comms' real gRPC server on loopback: an e-stop recorded only in the store
(a dashboard in another process, the CLI) reaches the robot's Control stream and is re-sent
until the robot's heartbeat says it holds; a clear reaches it the same way, and the robot's
own still-e-stopped heartbeat does not overrule the operator's clear."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from comms.client import ControlListener, EdgeClient, enroll, make_channel
from comms.proto import robofleet_pb2 as pb
from comms.server import CloudServer
from robofleet.app.orchestration.estop import EstopSync
from robofleet.store.models import Robot, RobotStatus
from robofleet.store.store import MetadataStore, upgrade
from tests.comms.helpers import fast_settings


@pytest.fixture
def store(db_url: str) -> Iterator[MetadataStore]:
    upgrade(db_url)
    s = MetadataStore(db_url)
    yield s
    s.close()


class LatchingRobot:
    """Heartbeats its state; latches on estop, unlatches on clear_estop, the first ``deaf``
    e-stops are lost on the way (a reconnecting robot)."""

    def __init__(self, server: CloudServer, store: MetadataStore, deaf: int) -> None:
        settings = fast_settings()
        channel = make_channel(server.address, settings)
        token = store.create_enrollment_token(timedelta(minutes=5))
        self.robot_id, credential = enroll(channel, token, "r-1", "metaworld-sawyer")
        self.client = EdgeClient(channel, credential, settings)
        self.deaf = deaf
        self.received: list[str] = []
        self.state = "running"
        self.client.heartbeat(self.state, None, {})
        self.listener = ControlListener(self.client, self._on)

    def _on(self, cmd: pb.ControlCommand) -> None:
        kind = pb.ControlCommand.Kind.Name(cmd.kind).lower()
        self.received.append(kind)
        if kind == "estop" and self.received.count("estop") <= self.deaf:
            return
        if kind in ("estop", "clear_estop"):
            self.state = "estopped" if kind == "estop" else "running"
            self.client.heartbeat(self.state, None, {})


def _status(store: MetadataStore, robot_id: int) -> RobotStatus:
    with store.session() as s:
        robot = s.get(Robot, robot_id)
        assert robot is not None
        return robot.status


def _set_status(store: MetadataStore, robot_id: int, status: RobotStatus) -> None:
    with store.session() as s:
        robot = s.get(Robot, robot_id)
        assert robot is not None
        robot.status = status


def _until(cond: Callable[[], object], step: Callable[[], object], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        step()
        time.sleep(0.05)


def test_store_estop_and_clear_reach_the_robot_until_its_heartbeat_agrees(
    store: MetadataStore,
) -> None:
    server = CloudServer(fast_settings(), store, lambda _run: None, port=0)
    server.start()
    robot = LatchingRobot(server, store, deaf=2)
    sync = EstopSync(store, server, resend_s=0.1)
    try:
        assert robot.listener.connected.wait(10)
        time.sleep(0.3)  # the server registers the stream after the client's call starts
        assert sync.sync() == []  # nothing to do while the store and the robot agree
        _set_status(store, robot.robot_id, RobotStatus.ESTOPPED)  # e.g. another process
        _until(lambda: robot.state == "estopped", sync.sync)
        assert robot.received.count("estop") == 3  # two lost, sent again until it holds
        n = len(robot.received)
        for _ in range(5):
            assert sync.sync() == []  # agreeing: nothing more is sent
        assert len(robot.received) == n

        _set_status(store, robot.robot_id, RobotStatus.IDLE)  # an operator clears it
        # The robot still reports estopped until the clear arrives; that does not overrule it.
        robot.client.heartbeat("estopped", None, {})
        assert _status(store, robot.robot_id) == RobotStatus.IDLE
        _until(lambda: robot.state == "running", sync.sync)
        assert robot.received[-1] == "clear_estop"
        assert _status(store, robot.robot_id) == RobotStatus.IDLE
        # A robot that e-stops itself (its own button) is flagged from its heartbeat.
        robot.client.heartbeat("estopped", None, {})
        assert _status(store, robot.robot_id) == RobotStatus.ESTOPPED
        assert sync.sync() == []  # it holds already: nothing to push
    finally:
        robot.listener.close()
        server.close()


def test_dashboard_estop_in_the_cloud_process_reaches_the_robot_at_once(
    store: MetadataStore, tmp_path: Path
) -> None:
    from dashboard.accounts import create_user
    from dashboard.app import create_app
    from robofleet.app.orchestration.manager import QueuedRunManager
    from robofleet.store.accounts import Role
    from tests.dashboard.conftest import PASSWORD, login, make_settings

    create_user(store, "op", PASSWORD, Role.OPERATOR, actor="test")
    server = CloudServer(fast_settings(), store, lambda _run: None, port=0)
    server.start()
    robot = LatchingRobot(server, store, deaf=0)
    settings = make_settings(tmp_path / "data", store.url)
    manager = QueuedRunManager(store, settings.data_dir)
    app = create_app(settings, store, manager, robot_control=server)
    try:
        assert robot.listener.connected.wait(10)
        time.sleep(0.3)
        op = login(app, "op")
        assert op.post(f"/api/robots/{robot.robot_id}/estop").status_code == 200
        _until(lambda: robot.state == "estopped", lambda: None, timeout=5)  # no sync running
        assert op.post(f"/api/robots/{robot.robot_id}/clear-estop").status_code == 200
        _until(lambda: robot.state == "running", lambda: None, timeout=5)
        assert robot.received == ["estop", "clear_estop"]
    finally:
        robot.listener.close()
        server.close()
