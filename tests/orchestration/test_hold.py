"""RobotHold over comms' real gRPC server on loopback: pause/resume reach a robot's Control
stream, and a robot whose heartbeat disagrees (a lost command, a restarted agent) is told
again until it agrees. The robot side is a scripted gRPC client, as a robot computer would be."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from comms.client import ControlListener, EdgeClient, enroll, make_channel
from comms.proto import robofleet_pb2 as pb
from comms.server import CloudServer
from robofleet.app.orchestration.hold import RobotHold
from robofleet.store.models import Run, RunState
from robofleet.store.store import MetadataStore, upgrade
from tests.comms.helpers import fast_settings

RUN = "run-hold"


@pytest.fixture
def store(db_url: str) -> Iterator[MetadataStore]:
    upgrade(db_url)
    s = MetadataStore(db_url)
    with s.session() as sess:
        sess.add(
            Run(
                id=RUN,
                name="hold",
                algorithm="hg-dagger",
                state=RunState.RUNNING,
                spec={},
                run_dir="",
            )
        )
    yield s
    s.close()


class ScriptedRobot:
    """Heartbeats ``running``; obeys pause/resume except the first ``ignore`` pauses."""

    def __init__(self, server: CloudServer, store: MetadataStore, name: str, ignore: int) -> None:
        settings = fast_settings()
        channel = make_channel(server.address, settings)
        token = store.create_enrollment_token(timedelta(minutes=5))
        self.robot_id, credential = enroll(channel, token, name, "metaworld-sawyer")
        self.client = EdgeClient(channel, credential, settings)
        self.state = "running"
        self.received: list[str] = []
        self.ignore = ignore
        self.client.heartbeat(self.state, None, {})
        self.listener = ControlListener(self.client, self._on)

    def _on(self, cmd: pb.ControlCommand) -> None:
        kind = pb.ControlCommand.Kind.Name(cmd.kind).lower()
        self.received.append(kind)
        if kind == "pause" and self.received.count("pause") <= self.ignore:
            return  # lost on the way (or an agent that restarted unpaused)
        if kind in ("pause", "resume"):
            state = "paused" if kind == "pause" else "running"
            self.client.heartbeat(state, None, {})  # as the agent does on a change
            self.state = state  # once the cloud has it

    def close(self) -> None:
        self.listener.close()


def _until(cond: Callable[[], object], step: Callable[[], object], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        step()
        time.sleep(0.05)


def test_pause_and_resume_reach_robots_and_are_resent_until_heartbeats_agree(
    store: MetadataStore,
) -> None:
    server = CloudServer(fast_settings(), store, lambda _run: None, port=0)
    server.start()
    obedient = ScriptedRobot(server, store, "r-ok", ignore=0)
    deaf = ScriptedRobot(server, store, "r-deaf", ignore=2)
    robots = {"r-ok": obedient.robot_id, "r-deaf": deaf.robot_id}
    store.lease_robots(RUN, list(robots.values()))
    hold = RobotHold(store, server, RUN, resend_s=0.2)
    try:
        assert obedient.listener.connected.wait(10) and deaf.listener.connected.wait(10)
        time.sleep(0.3)  # the server registers the streams after the client's call starts
        reached = hold.want(True, robots, "test pause")
        assert reached == ["r-deaf", "r-ok"]
        _until(lambda: obedient.state == "paused", lambda: None)
        assert hold.follow(robots) == ["r-ok"]  # the deaf one still reports running
        _until(lambda: hold.follow(robots) == ["r-deaf", "r-ok"], lambda: None)
        assert deaf.received.count("pause") >= 3  # two lost, told again until it holds
        assert obedient.received == ["pause"]  # agreeing robots are not told again
        n = len(deaf.received)
        for _ in range(5):  # both agree: nothing more is sent
            hold.follow(robots)
            time.sleep(0.25)
        assert len(deaf.received) == n

        reached = hold.want(False, robots, "test resume")
        assert reached == ["r-deaf", "r-ok"]
        _until(lambda: hold.follow(robots) == [], lambda: None)
        assert obedient.state == deaf.state == "running"
        assert obedient.received == ["pause", "resume"]
    finally:
        obedient.close()
        deaf.close()
        server.close()


def test_an_estopped_or_unconnected_robot_is_not_nagged(store: MetadataStore) -> None:
    server = CloudServer(fast_settings(), store, lambda _run: None, port=0)
    server.start()
    robot = ScriptedRobot(server, store, "r-stopped", ignore=10**6)
    robot.client.heartbeat("estopped", None, {})
    pushes: list[str] = []
    real_push = server.push_control

    def counting_push(robot_id: int, kind: str, run_id: str = "", reason: str = "") -> bool:
        pushes.append(kind)
        return real_push(robot_id, kind, run_id, reason)

    server.push_control = counting_push  # type: ignore[method-assign]
    hold = RobotHold(store, server, RUN, resend_s=0.0)
    try:
        robots = {"r-stopped": robot.robot_id, "r-never-connected": 987654}
        assert robot.listener.connected.wait(10)
        hold.want(True, robots, "test pause")
        assert len(pushes) == 2
        for _ in range(10):
            assert hold.follow(robots) == []
        assert len(pushes) == 2  # e-stopped and unknown robots are not re-sent to
    finally:
        robot.close()
        server.close()
