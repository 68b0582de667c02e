"""LeRobot teleoperators as operators (``edge_agent.teleop``), built by LeRobot's own factory.

The keyboard is LeRobot's ``KeyboardEndEffectorTeleop``. There is no display here, so pynput's
platform backend is replaced by a headless one (``HeadlessKeyboard``): LeRobot's own
``connect`` starts its listener, and key events reach LeRobot through the ``on_press`` /
``on_release`` callbacks it registered, as pynput's X11 backend delivers them; everything
above (its event queue, its action and its episode events) is LeRobot's code.
"""

from __future__ import annotations

import enum
import threading
from typing import Any

import numpy as np
import pytest

from edge_agent.teleop import LeRobotOperator, TeleoperatorUnavailable, make_lerobot_operator
from edge_agent.teleop_mapping import teleoperator_config
from tests.edge_agent.helpers import BiasPolicy, make_agent, spooled_rows
from tests.edge_agent.test_chunk_freshness import CountingChunks, _planned
from tests.fakes.robot import PointRobot

EE_NAMES = ["delta_x", "delta_y", "delta_z", "gripper"]


class HeadlessKeyboard:
    """A pynput keyboard backend without a display: ``Listener`` is a live thread until
    stopped; ``press`` / ``release`` call the callbacks the listener was given. ``Key`` has
    one distinct member per pynput key name (pynput's dummy backend aliases them all)."""

    def __init__(self) -> None:
        from pynput.keyboard import Key as BaseKey
        from pynput.keyboard import KeyCode

        self.KeyCode = KeyCode
        self.Key = enum.Enum(  # type: ignore[misc]
            "Key", {n: KeyCode.from_vk(1000 + i) for i, n in enumerate(BaseKey.__members__)}
        )
        self.listeners: list[Any] = []
        outer = self

        class Listener(threading.Thread):
            def __init__(self, on_press: Any = None, on_release: Any = None) -> None:
                super().__init__(daemon=True)
                self.on_press, self.on_release = on_press, on_release
                self._stopped = threading.Event()
                outer.listeners.append(self)

            def run(self) -> None:
                self._stopped.wait()

            def stop(self) -> None:
                self._stopped.set()

        self.Listener = Listener

    def press(self, key: Any) -> None:
        for listener in self.listeners:
            if listener.is_alive():
                listener.on_press(key)

    def release(self, key: Any) -> None:
        for listener in self.listeners:
            if listener.is_alive():
                listener.on_release(key)

    def char(self, c: str) -> Any:
        return self.KeyCode.from_char(c)


@pytest.fixture
def kb(monkeypatch):
    monkeypatch.setenv("PYNPUT_BACKEND", "dummy")  # pynput imports without a display
    import lerobot.teleoperators.keyboard.teleop_keyboard as lerobot_kb

    board = HeadlessKeyboard()
    monkeypatch.setattr(lerobot_kb, "keyboard", board)
    monkeypatch.setattr(lerobot_kb, "PYNPUT_AVAILABLE", True)
    monkeypatch.setattr(lerobot_kb, "pynput_can_capture", lambda: True)
    yield board
    for listener in board.listeners:
        listener.stop()


def _keyboard_ee(robot: Any, tmp_path, **extra: Any) -> LeRobotOperator:
    options = {"type": "keyboard_ee", "calibration_dir": str(tmp_path / "calib"), **extra}
    return make_lerobot_operator(
        options, robot.action_features, robot.observation_features, listen=False
    )


class AtStep:
    """Runs ``events[n]`` while step n's action is applied: what the person does then is
    read at step n + 1."""

    def __init__(self, events: dict[int, Any]) -> None:
        self.events, self.n = events, 0

    def __call__(self) -> None:
        if self.n in self.events:
            self.events[self.n]()
        self.n += 1


def _named_point(episode_steps: int, at: AtStep) -> PointRobot:
    class NamedPoint(PointRobot):
        """The suite's point robot with end-effector action names (Meta-World's)."""

        def __init__(self) -> None:
            super().__init__(episode_steps=episode_steps)
            action = self.spec.action_features["action"].model_copy(update={"names": EE_NAMES})
            self.spec = self.spec.model_copy(update={"action_features": {"action": action}})

        def _apply_action(self, action):
            at()
            return super()._apply_action(action)

    return NamedPoint()


def test_keyboard_takes_over_a_metaworld_arm_and_hands_back(kb, tmp_path):
    from hal.drivers.metaworld import MetaWorldDriver

    class Arm(MetaWorldDriver):
        def _apply_action(self, action):
            at()
            return super()._apply_action(action)

    K = kb.Key
    at = AtStep(
        {
            1: lambda: (op.on_key("space"), kb.press(K.space), kb.press(K.left)),
            2: lambda: (kb.release(K.left), kb.press(K.shift_r), kb.press(K.ctrl_l)),
            3: lambda: (kb.release(K.shift_r), op.on_key("space")),
            5: lambda: kb.press(kb.char("s")),  # LeRobot keyboard_ee's "success"
        }
    )
    robot = Arm("teleop-arm", task="reach-v3", max_episode_steps=10)
    op = _keyboard_ee(robot, tmp_path)
    assert op.keys == EE_NAMES and op.feedback is None
    policy = BiasPolicy()
    policy.bias[:] = -0.25
    agent = make_agent(tmp_path, robot, policy, operator=op)
    agent.run(episodes=1)
    rows = spooled_rows(agent.uplink.spool)
    # the person's "s" at step 5 ends the episode after step 6 as a success
    assert rows.column("is_intervention").to_pylist() == [False] * 2 + [True] * 2 + [False] * 3
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    # keyboard_ee: left = +x; right shift = +z; its gripper command 1 (stay) keeps the episode's
    # open gripper (-1), left ctrl's 0 (close) closes it (+1): gripper_values' default
    assert np.allclose(executed[2], [1, 0, 0, -1]) and np.allclose(executed[3], [0, 0, 1, 1])
    assert np.allclose(executed[[0, 1, 4, 5, 6]], -0.25)
    assert rows.column("terminated").to_pylist()[-1] is True
    op.close()  # LeRobot's disconnect stops its listener
    for listener in kb.listeners:
        listener.join(2.0)
        assert not listener.is_alive()


def test_a_keyboard_takeover_hands_back_to_a_fresh_chunk(kb, tmp_path):
    at = AtStep({1: lambda: op.on_key("space"), 3: lambda: op.on_key("space")})
    robot = _named_point(12, at)
    op = _keyboard_ee(robot, tmp_path)
    policy = CountingChunks()
    agent = make_agent(tmp_path, robot, policy, operator=op)
    agent.run(episodes=1)
    rows = spooled_rows(agent.uplink.spool)
    assert rows.column("is_intervention").to_pylist()[:6] == [
        False,
        False,
        True,
        True,
        False,
        False,
    ]
    planned = _planned(rows)
    # as with any operator (test_chunk_freshness): the handback is a fresh chunk's first row
    assert planned[:5] == [(1, 0), (1, 1), (1, 2), (2, 0), (3, 0)]
    assert planned[5:8] == [(3, 1), (3, 2), (3, 3)]
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    assert np.allclose(executed[2:4], [0, 0, 0, -1])  # no key held: hold still, gripper open
    op.close()


def test_an_actuated_leader_is_driven_to_the_follower_before_the_person_takes_over(tmp_path):
    import tests.fakes.lerobot_leader  # noqa: F401  (registers fake_leader)
    from hal.drivers.lerobot import LeRobotDriver

    robot = LeRobotDriver(
        "arm-1", "fake_follower", {"max_relative_target": None}, "tests.fakes.lerobot"
    )
    robot.connect()
    robot.robot.positions.update(shoulder_pan=30.0, elbow_flex=-20.0)  # where the follower is
    op = make_lerobot_operator(
        {"type": "fake_leader", "handover_s": 0.05, "calibration_dir": str(tmp_path)},
        robot.action_features,
        robot.observation_features,
        listen=False,
    )
    leader = op.teleop
    assert op.feedback is not None and leader.positions["shoulder_pan"] == 0.0
    obs = robot.reset()
    proposed = np.zeros(6, np.float32)
    assert not op.step(obs, proposed).is_intervention
    op.toggle()
    out = op.step(obs, proposed)
    # LeRobot's interpolation ends at the follower's pose; then the torque is released
    assert leader.feedback[-1]["shoulder_pan.pos"] == 30.0 and not leader.torque
    assert out.is_intervention and np.allclose(out.action, obs["observation.state"])
    leader.move(shoulder_pan=32.0)  # the person moves it
    assert op.step(obs, proposed).action[0] == 32.0
    # The leader's bus fails mid-takeover: the follower holds at its own pose, nothing raises.
    leader.fail_reads = True
    held = op.step(obs, proposed)
    assert held.reason == "device_lost" and np.allclose(held.action, obs["observation.state"])
    assert op.lost is not None and "fake_leader" in op.lost
    leader.fail_reads = False
    assert op.step(obs, proposed).action[0] == 32.0 and op.lost is None
    op.toggle()
    assert not op.step(obs, proposed).is_intervention and leader.torque  # held again
    op.close()
    robot.disconnect()


def test_leader_connection_and_calibration_errors_name_the_device(tmp_path):
    import tests.fakes.lerobot_leader  # noqa: F401
    from hal.drivers.lerobot import LeRobotDriver

    robot = LeRobotDriver("arm-1", "fake_follower", {}, "tests.fakes.lerobot")
    base = {"type": "fake_leader", "calibration_dir": str(tmp_path), "port": "/dev/ttyX9"}
    feats = (robot.action_features, robot.observation_features)
    with pytest.raises(TeleoperatorUnavailable, match=r"fake_leader on /dev/ttyX9.*plugged in"):
        make_lerobot_operator({**base, "unplugged": True}, *feats, listen=False)
    with pytest.raises(TeleoperatorUnavailable, match="not calibrated; run lerobot-calibrate"):
        make_lerobot_operator({**base, "calibrated": False, "id": "l1"}, *feats, listen=False)


def test_refusals_name_what_is_wrong(kb, tmp_path):
    with pytest.raises(ValueError, match=r"no LeRobot teleoperator.*so101_leader"):
        teleoperator_config({"type": "no_such_leader"})
    with pytest.raises(ValueError, match=r"speed: not a field.*use_gripper"):
        teleoperator_config({"type": "keyboard_ee", "speed": 2})
    with pytest.raises(ValueError, match="bad keyboard_ee"):
        teleoperator_config({"type": "keyboard_ee", "use_gripper": "sometimes"})
    with pytest.raises(ValueError, match="type=NAME"):
        teleoperator_config({"port": "/dev/ttyACM0"})
    with pytest.raises(ValueError, match="module=no_such_pkg"):
        teleoperator_config({"type": "x", "module": "no_such_pkg"})
    renamed = PointRobot()
    action = renamed.spec.action_features["action"].model_copy(
        update={"names": ["dx", "dy", "dz", "grip"]}
    )
    renamed.spec = renamed.spec.model_copy(update={"action_features": {"action": action}})
    with pytest.raises(
        ValueError, match=r"no robot action for \['delta_x'.*no teleoperator key for \['dx'"
    ):
        _keyboard_ee(renamed, tmp_path)
    mapped = _keyboard_ee(
        renamed,
        tmp_path,
        action_map={"delta_x": "dx", "delta_y": "dy", "delta_z": "dz", "gripper": "grip"},
    )
    assert mapped.keys == EE_NAMES
    mapped.close()
    with pytest.raises(ValueError, match="no teleoperator key for \\['gripper'\\]"):
        _keyboard_ee(_named_point(5, AtStep({})), tmp_path, use_gripper=False)
    with pytest.raises(ValueError, match="name no dimensions"):
        _keyboard_ee(PointRobot(), tmp_path)
    with pytest.raises(
        ValueError, match="keyboard teleoperator does not describe its action.*keyboard_ee"
    ):
        _keyboard_ee(_named_point(5, AtStep({})), tmp_path, type="keyboard")


def test_robofleet_edge_takes_operator_options():
    from robofleet.commands.edge import build_parser, options_from_args

    args = build_parser().parse_args(
        [
            "--operator",
            "lerobot",
            "--operator-option",
            "type=gamepad",
            "--operator-option",
            "use_gripper=false",
        ]
    )
    assert options_from_args(args).operator_options == {"type": "gamepad", "use_gripper": False}
    args = build_parser().parse_args(
        ["--operator", "keyboard", "--operator-option", "type=gamepad"]
    )
    with pytest.raises(ValueError, match="--operator-option is for --operator lerobot"):
        options_from_args(args)
    assert "--operator-option" in build_parser().format_help()


def test_a_gamepad_that_is_not_there_is_refused_when_the_agent_is_built(monkeypatch, tmp_path):
    """LeRobot's gamepad teleop calls itself connected without a gamepad; one read tells."""
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    robot = _named_point(5, AtStep({}))
    with pytest.raises(TeleoperatorUnavailable, match="gamepad: connected but reading it failed"):
        make_lerobot_operator(
            {"type": "gamepad", "calibration_dir": str(tmp_path)},
            robot.action_features,
            robot.observation_features,
            listen=False,
        )


def test_a_lost_keyboard_holds_a_taken_over_arm_and_the_run_goes_on(kb, tmp_path, caplog):
    def unplug() -> None:
        def gone() -> None:
            raise OSError("No such device")

        op.teleop.get_action = gone

    def replug() -> None:
        del op.teleop.get_action  # the class's own method again

    at = AtStep(
        {
            1: lambda: (op.on_key("space"), kb.press(kb.Key.left)),
            2: lambda: (kb.press(kb.Key.ctrl_l), unplug()),
            4: replug,
            5: lambda: op.on_key("space"),
        }
    )
    robot = _named_point(10, at)
    op = _keyboard_ee(robot, tmp_path)
    policy = BiasPolicy()
    policy.bias[:] = 0.5
    agent = make_agent(tmp_path, robot, policy, operator=op)
    with caplog.at_level("WARNING"):
        agent.run(episodes=1)
    rows = spooled_rows(agent.uplink.spool)
    assert rows.num_rows == 10  # the episode ran to its end
    flags = rows.column("is_intervention").to_pylist()
    assert flags == [False, False, True, True, True, True, False, False, False, False]
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    assert np.allclose(executed[3:5], [0, 0, 0, -1])  # held still while the device is gone
    assert np.allclose(executed[6:], 0.5)
    assert "stopped answering" in caplog.text and "answers again" in caplog.text
    op.close()


def test_gripper_values_are_checked_by_name(kb, tmp_path):
    robot = _named_point(5, AtStep({}))
    with pytest.raises(ValueError, match="gripper_values='wide'"):
        _keyboard_ee(robot, tmp_path, gripper_values="wide")
    op = _keyboard_ee(robot, tmp_path, gripper_values="[0.0, 1.0]")
    assert op.gripper == (3, 0.0, 1.0)
    op.close()
    op = _keyboard_ee(robot, tmp_path, gripper_values="none")
    assert op.gripper is None
    op.close()
