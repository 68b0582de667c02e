"""RobotHold over comms' real gRPC server on loopback: pause/resume reach a robot's Control
stream, and a robot whose heartbeat disagrees (a lost command, a restarted agent) is told
again until it agrees. The robot side is a scripted gRPC client, as a robot computer would be."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from foundation.store.metadata_store import MetadataStore, upgrade
from foundation.store.models import Run, RunState
from runs.hold import RobotHold
from tests.fakes.cloud import PAUSE_RESUME, Cloud, RobotComputer
from tests.fakes.procs import wait_until

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


def test_pause_and_resume_reach_robots_and_are_resent_until_heartbeats_agree(
    store: MetadataStore,
) -> None:
    cloud = Cloud(store, lambda _run: None)
    obedient = RobotComputer(cloud, "r-ok", PAUSE_RESUME)
    deaf = RobotComputer(cloud, "r-deaf", PAUSE_RESUME, lose={"pause": 2})
    robots = {"r-ok": obedient.robot_id, "r-deaf": deaf.robot_id}
    store.lease_robots(RUN, list(robots.values()))
    # Longer than a heartbeat takes to land on a loaded machine: a robot that obeyed is not
    # told again while its heartbeat is on the way.
    hold = RobotHold(store, cloud.server, RUN, resend_s=1.0)
    try:
        assert obedient.listener.connected.wait(10) and deaf.listener.connected.wait(10)
        time.sleep(0.3)  # the server registers the streams after the client's call starts
        reached = hold.want(True, robots, "test pause")
        assert reached == ["r-deaf", "r-ok"]
        wait_until(lambda: obedient.state == "paused", 15)
        assert hold.follow(robots) == ["r-ok"]  # the deaf one still reports running
        wait_until(lambda: hold.follow(robots) == ["r-deaf", "r-ok"], 15)
        assert deaf.received.count("pause") >= 3  # two lost, told again until it holds
        assert obedient.received == ["pause"]  # agreeing robots are not told again
        n = len(deaf.received)
        for _ in range(5):  # both agree: nothing more is sent
            hold.follow(robots)
            time.sleep(0.25)
        assert len(deaf.received) == n

        reached = hold.want(False, robots, "test resume")
        assert reached == ["r-deaf", "r-ok"]
        wait_until(lambda: hold.follow(robots) == [], 15)
        assert obedient.state == deaf.state == "running"
        assert obedient.received == ["pause", "resume"]
    finally:
        obedient.close()
        deaf.close()
        cloud.close()


def test_an_estopped_or_unconnected_robot_is_not_nagged(store: MetadataStore) -> None:
    cloud = Cloud(store, lambda _run: None)
    server = cloud.server
    robot = RobotComputer(cloud, "r-stopped", PAUSE_RESUME, lose={"pause": 10**6})
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
        cloud.close()
