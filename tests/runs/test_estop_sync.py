"""EstopSync over comms' real gRPC server on loopback: an e-stop recorded only in the store
(a dashboard in another process, the CLI) reaches the robot's Control stream and is re-sent
until the robot's heartbeat says it holds; a clear reaches it the same way, and the robot's
own still-e-stopped heartbeat does not overrule the operator's clear."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Robot, RobotStatus
from runs.estop import EstopSync
from tests.fakes.cloud import ESTOP_CLEAR, Cloud, RobotComputer
from tests.fakes.procs import wait_until


@pytest.fixture
def store(db_url: str) -> Iterator[MetadataStore]:
    upgrade(db_url)
    s = MetadataStore(db_url)
    yield s
    s.close()


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


def test_store_estop_and_clear_reach_the_robot_until_its_heartbeat_agrees(
    store: MetadataStore,
) -> None:
    cloud = Cloud(store, lambda _run: None)
    robot = RobotComputer(cloud, "r-1", ESTOP_CLEAR, lose={"estop": 2})
    sync = EstopSync(store, cloud.server, resend_s=0.1)
    try:
        assert robot.listener.connected.wait(10)
        time.sleep(0.3)  # the server registers the stream after the client's call starts
        assert sync.sync() == []  # nothing to do while the store and the robot agree
        _set_status(store, robot.robot_id, RobotStatus.ESTOPPED)  # e.g. another process
        wait_until(lambda: robot.state == "estopped", 15, every=sync.sync)
        assert robot.received.count("estop") == 3  # two lost, sent again until it holds
        n = len(robot.received)
        for _ in range(5):
            assert sync.sync() == []  # agreeing: nothing more is sent
        assert len(robot.received) == n

        _set_status(store, robot.robot_id, RobotStatus.IDLE)  # an operator clears it
        # The robot still reports estopped until the clear arrives; that does not overrule it.
        robot.client.heartbeat("estopped", None, {})
        assert _status(store, robot.robot_id) == RobotStatus.IDLE
        wait_until(lambda: robot.state == "running", 15, every=sync.sync)
        assert robot.received[-1] == "clear_estop"
        assert _status(store, robot.robot_id) == RobotStatus.IDLE
        # A robot that e-stops itself (its own button) is flagged from its heartbeat.
        robot.client.heartbeat("estopped", None, {})
        assert _status(store, robot.robot_id) == RobotStatus.ESTOPPED
        assert sync.sync() == []  # it holds already: nothing to push
    finally:
        robot.close()
        cloud.close()


def test_dashboard_estop_in_the_cloud_process_reaches_the_robot_at_once(
    store: MetadataStore, tmp_path: Path
) -> None:
    from dashboard.accounts import create_user
    from dashboard.app import create_app
    from foundation.store.accounts import Role
    from runs.manager import QueuedRunManager
    from tests.dashboard.conftest import PASSWORD, login, make_settings

    create_user(store, "op", PASSWORD, Role.OPERATOR, actor="test")
    cloud = Cloud(store, lambda _run: None)
    robot = RobotComputer(cloud, "r-1", ESTOP_CLEAR)
    settings = make_settings(tmp_path / "data", store.url)
    manager = QueuedRunManager(store, settings.data_dir)
    app = create_app(settings, store, manager, robot_control=cloud.server)
    try:
        assert robot.listener.connected.wait(10)
        time.sleep(0.3)
        op = login(app, "op")
        assert op.post(f"/api/robots/{robot.robot_id}/estop").status_code == 200
        wait_until(lambda: robot.state == "estopped", 5)  # no sync running
        assert op.post(f"/api/robots/{robot.robot_id}/clear-estop").status_code == 200
        wait_until(lambda: robot.state == "running", 5)
        assert robot.received == ["estop", "clear_estop"]
    finally:
        robot.close()
        cloud.close()
