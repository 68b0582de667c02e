"""The driver contract: every driver passes the same checks (``hal.contract``, the module a lab
runs against its own driver): the suite's fake robot, the stand-ins behind the LeRobot and
ROS 2 drivers, a real LeRobot arm too when one is attached: set
ROBOFLEET_TEST_LEROBOT='so100_follower:/dev/ttyACM0'."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hal.contract import CHECKS, check_driver, run_check
from hal.driver import ActionError, Applied, RobotDriver, ScriptedExpertDriver, TaskCatalogDriver
from hal.drivers import make_driver
from tests.fakes.robot import PointRobot
from tests.fakes.ros2_robot import Ros2Robot

Factory = Callable[[], RobotDriver]


def _point(tmp: Path, request: pytest.FixtureRequest) -> RobotDriver:
    return PointRobot(episode_steps=6)


def _metaworld(tmp: Path, request: pytest.FixtureRequest) -> RobotDriver:
    return make_driver("metaworld", "mw-0", task="reach-v3", max_episode_steps=6)


def _metaworld_camera(tmp: Path, request: pytest.FixtureRequest) -> RobotDriver:
    return make_driver(
        "metaworld",
        "mw-cam",
        task="reach-v3",
        cameras=["corner"],
        image_size=(32, 48),
        max_episode_steps=6,
    )


def _metaworld_blind(tmp: Path, request: pytest.FixtureRequest) -> RobotDriver:
    """Meta-World hiding reward and success and not resetting itself, as an arm."""
    return make_driver(
        "metaworld", "mw-blind", task="reach-v3", max_episode_steps=6, reward="none",
        detects_success=False, self_reset=False,
    )  # fmt: skip


def _gym(tmp: Path, request: pytest.FixtureRequest) -> RobotDriver:
    return make_driver("gymnasium", "pendulum-0", env_id="Pendulum-v1", max_episode_steps=6)


def _lerobot_fake(tmp: Path, request: pytest.FixtureRequest) -> RobotDriver:
    return make_driver(
        "lerobot",
        "arm-0",
        type="fake_follower",
        module="tests.fakes.lerobot",
        config={"calibration_dir": str(tmp / "calib"), "max_relative_target": 5.0},
        max_episode_steps=6,
    )


def _lerobot_hardware(tmp: Path, request: pytest.FixtureRequest) -> RobotDriver:
    robot_type, port = os.environ["ROBOFLEET_TEST_LEROBOT"].split(":", 1)
    return make_driver(
        "lerobot", "arm-hw", type=robot_type, config={"port": port}, max_episode_steps=6
    )


def _ros2(tmp: Path, request: pytest.FixtureRequest) -> RobotDriver:
    echo: Ros2Robot = request.getfixturevalue("ros2_echo")
    return make_driver(
        "ros2",
        "ros-0",
        joints=echo.joints,
        domain_id=echo.domain_id,
        loopback_only=True,
        position_low=[-1.0] * 3,
        position_high=[1.0] * 3,
        max_step=0.5,
        connect_timeout_s=20,
        max_episode_steps=6,
    )


DRIVERS = [
    pytest.param(_point, id="point-fake"),
    pytest.param(_metaworld, id="metaworld"),
    pytest.param(_metaworld_camera, id="metaworld-camera"),
    pytest.param(_metaworld_blind, id="metaworld-blind"),
    pytest.param(_gym, id="gymnasium"),
    pytest.param(_lerobot_fake, id="lerobot-fake"),
    pytest.param(
        _lerobot_hardware,
        id="lerobot-hardware",
        marks=pytest.mark.skipif(
            "ROBOFLEET_TEST_LEROBOT" not in os.environ, reason="no LeRobot arm attached"
        ),
    ),
    pytest.param(_ros2, id="ros2"),
]


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("make", DRIVERS)
def test_driver_passes_the_contract(
    make: Callable[[Path, pytest.FixtureRequest], RobotDriver],
    check: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Each shipped check (``hal.contract``, what a lab runs against its own driver) on a fresh
    driver of each kind; a check that does not apply (no action bounds, no step limit) skips."""
    result = run_check(check, lambda: make(tmp_path, request))
    if result.status == "skip":
        pytest.skip(result.reason)
    assert result.status == "pass", f"{check}: {result.reason}"


def test_ros2_commands_reach_the_robot_as_sent(ros2_echo: Ros2Robot) -> None:
    """What ``send_action`` reports as sent is exactly what the robot received: the stand-in
    robot republishes every command it takes on ``/joint_commands_echo``; a rejected action
    publishes nothing."""
    import time

    from cyclonedds.core import Policy, Qos
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic

    from hal.ros2.dds import participant
    from hal.ros2.types import JointState, dds_topic

    dp = participant(ros2_echo.domain_id, loopback_only=True)
    qos = Qos(Policy.Reliability.Reliable(0), Policy.History.KeepLast(256))  # keep every echo
    echoes = DataReader(dp, Topic(dp, dds_topic("/joint_commands_echo"), JointState), qos=qos)
    d = make_driver(
        "ros2", "ros-echo", joints=ros2_echo.joints, domain_id=ros2_echo.domain_id,
        loopback_only=True, position_low=[-1.0] * 3, position_high=[1.0] * 3, max_step=0.5,
        connect_timeout_s=20,
    )  # fmt: skip

    def take(want: int, timeout_s: float = 10.0) -> list[tuple[list[str], np.ndarray]]:
        got: list[tuple[list[str], np.ndarray]] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            for m in echoes.take(64):
                if isinstance(m, JointState):  # not a writer's lifecycle notice
                    got.append((list(m.name), np.asarray(m.position, np.float32)))
            time.sleep(0.01)
        return got

    try:
        d.connect()
        d.reset()
        # DDS matches writers and readers asynchronously: command until the first echo is back.
        deadline = time.monotonic() + 20
        while not take(1, 0.2):
            assert time.monotonic() < deadline, "no command echoed within 20 s"
            d.send_action(np.zeros(3, np.float32))
        take(10**6, 0.5)  # drain the warm-up echoes

        sent = [d.send_action(np.asarray(a, np.float32))["action"] for a in
                ([0.1, -0.2, 0.3], [0.4, 0.0, -0.3], [5.0, -5.0, 0.2])]  # fmt: skip
        with pytest.raises(ActionError):
            d.send_action(np.full(3, np.nan, np.float32))
        echoed = take(len(sent))
        time.sleep(0.3)
        echoed += take(10**6, 0.2)  # nothing more may arrive (the NaN action was not sent)
        assert [n for n, _ in echoed] == [ros2_echo.joints] * len(sent)
        for (_, pos), want in zip(echoed, sent, strict=True):
            np.testing.assert_array_equal(pos, want)
        assert np.all(np.abs(sent[2]) <= 1.0)  # the out-of-bounds one went out clipped
    finally:
        d.disconnect()


def test_make_driver_passes_a_kind_only_the_episode_options_it_takes() -> None:
    episode = {
        "tasks": ["reach-v3", "push-v3"],
        "max_episode_steps": 7,
        "seed": 3,
        "terminate_on_success": True,
    }
    mw = make_driver("metaworld", "mw-ep", episode)
    assert mw.spec.tasks == ["reach-v3", "push-v3"] and mw.spec.max_episode_steps == 7
    gym = make_driver("gymnasium", "pendulum-ep", episode, env_id="Pendulum-v1")
    assert gym.episode_options == frozenset() and gym.spec.max_episode_steps != 7
    with pytest.raises(ValueError, match="unknown episode options"):
        make_driver("metaworld", "mw-bad", {"colour": 1})


def test_a_scripted_expert_and_a_task_list_are_what_a_driver_offers() -> None:
    mw = make_driver("metaworld", "mw-x", {"tasks": ["reach-v3"]})
    assert isinstance(mw, ScriptedExpertDriver) and isinstance(mw, TaskCatalogDriver)
    assert {"reach-v3", "pick-place-v3"} <= set(mw.available_tasks())
    action = mw.expert("reach-v3")(np.zeros(39, np.float32))
    assert action.shape == (4,) and action.dtype == np.float32
    gym = make_driver("gymnasium", "pendulum-x", env_id="Pendulum-v1")
    assert not isinstance(gym, ScriptedExpertDriver | TaskCatalogDriver)


class _RewardOnABlindArm(PointRobot):
    """Declares no reward (an arm) yet reports one."""

    def __init__(self) -> None:
        super().__init__(episode_steps=6)
        caps = self.spec.capabilities.model_copy(update={"reward": "none"})
        self.spec = self.spec.model_copy(update={"capabilities": caps})


class _SuccessWithoutDetection(PointRobot):
    """Declares no success detection yet reports success."""

    def _apply_action(self, action: np.ndarray) -> Applied:
        return Applied(sent=action, reward=super()._apply_action(action).reward, success=True)


class _SpecChangedByConnect(PointRobot):
    """Describes itself one way unconnected and another once connected."""

    def _connect(self) -> None:
        self.spec = self.spec.model_copy(update={"control_hz": 10.0})


@pytest.mark.parametrize(
    ("make", "check", "why"),
    [
        (_RewardOnABlindArm, "signals_as_declared", "from a robot that declares reward 'none'"),
        (_SuccessWithoutDetection, "signals_as_declared", "declares detects_success False"),
        (_SpecChangedByConnect, "observe_act_and_disconnect", "connect() changed the spec"),
    ],
)
def test_a_driver_that_breaks_a_rule_fails_that_check(
    make: Callable[[], RobotDriver], check: str, why: str
) -> None:
    results = {r.name: r for r in check_driver(make)}
    assert results[check].failed and why in results[check].reason
    assert [n for n, r in results.items() if r.failed] == [check]  # every other rule holds
