"""The SpaceMouse operator (``edge_agent.spacemouse``) on real report bytes.

No SpaceMouse is plugged in here, so hidapi's module is replaced where the operator takes it
(``make_spacemouse_operator(..., hid=...)``) by ``tests.fakes.spacemouse.FakeHid``, which keeps
hidapi's contract for the calls the operator makes (``enumerate``, ``device``, ``open_path``,
``set_nonblocking``, ``read``, ``close``). ``test_the_fake_keeps_hidapis_contract`` runs the
same checks against the real ``hid`` module, so both answer alike where no device is needed; a
real device would pass the rest (reads of queued reports, ``OSError`` once unplugged).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from edge_agent.operators import make_operator
from edge_agent.spacemouse import (
    SpaceMouseUnavailable,
    action_slots,
    make_spacemouse_operator,
    parse_report,
    to_deltas,
)
from tests.edge_agent.helpers import BiasPolicy, make_agent, spooled_rows
from tests.edge_agent.test_lerobot_teleop import AtStep
from tests.fakes.robot import PointRobot
from tests.fakes.spacemouse import (
    SPACEMOUSE_WIRELESS,
    FakeHid,
    buttons,
    classic_rotation,
    classic_translation,
    wireless_motion,
)

OBS = {"observation.state": np.zeros(3, np.float32)}
EE = ["delta_x", "delta_y", "delta_z", "gripper"]
EE6 = ["delta_x", "delta_y", "delta_z", "delta_rx", "delta_ry", "delta_rz", "gripper"]


def _robot(names: list[str]) -> PointRobot:
    robot = PointRobot()
    action = robot.spec.action_features["action"].model_copy(
        update={"names": names, "shape": (len(names),)}
    )
    robot.spec = robot.spec.model_copy(update={"action_features": {"action": action}})
    return robot


def test_both_report_layouts_parse_with_their_signs():
    # a SpaceNavigator's report 1 as read from the wire: x = +350, y = -350, z = +1
    assert parse_report([0x01, 0x5E, 0x01, 0xA2, 0xFE, 0x01, 0x00]).translation == (350, -350, 1)
    assert parse_report(classic_rotation(-7, 0, 300)).rotation == (-7, 0, 300)
    both = parse_report(wireless_motion(10, -20, 30, -40, 50, -60))
    assert both.translation == (10, -20, 30) and both.rotation == (-40, 50, -60)
    assert parse_report(buttons(0b10)).buttons == 2
    assert parse_report([0x17, 0x55]) is None  # a battery report
    with pytest.raises(ValueError, match="report 2 has 3 bytes"):
        parse_report([2, 1, 2, 3])


def test_deltas_scale_flip_into_the_robots_frame_and_rise_from_the_deadzone():
    full = to_deltas(np.array([350, 350, 350, 350, 350, 350]))
    # device y points at the person and z down; the robot's y points away and z up
    assert full.tolist() == [1, -1, -1, 1, -1, -1]
    assert to_deltas(np.array([700, 0, 0, 0, 0, 0]))[0] == 1.0  # clipped at full deflection
    still = to_deltas(np.array([34, -34, 20, 30, -5, 0]), deadzone=0.1)
    assert still.tolist() == [0.0] * 6 and not np.signbit(still).any()
    # just past the edge: a small delta, not a jump to 0.1
    edge = to_deltas(np.array([36, 0, 0, 0, 0, 0]), deadzone=0.1)[0]
    assert 0 < edge < 0.005  # (36 / 350 - 0.1) / 0.9
    half = to_deltas(
        np.array([-210, 0, 0, 0, 0, 210]), deadzone=0.2, translation_scale=0.5, rotation_scale=2
    )
    assert np.allclose(half, [-0.25, 0, 0, 0, 0, -1.0])
    assert to_deltas(np.array([350, 0, 0, 0, 0, 0]), invert=[0])[0] == -1.0


def test_a_wireless_spacemouse_drives_rotation_where_the_robot_takes_it():
    hid = FakeHid()
    hid.plug(ids=SPACEMOUSE_WIRELESS, product="SpaceMouse Wireless")
    robot = _robot(EE6)
    op = make_spacemouse_operator(
        {"rotation_scale": 0.5, "deadzone": 0}, robot.action_features, hid=hid
    )
    assert op.name == "SpaceMouse Wireless (256f:c62e)"
    hid.send(wireless_motion(175, 0, -350, 0, 350, 0))
    assert not op.step(OBS, np.zeros(7)).is_intervention  # moving the cap alone takes nothing
    hid.send(buttons(1), buttons(0))
    out = op.step(OBS, np.zeros(7))
    assert out.is_intervention and out.reason == "spacemouse"
    assert np.allclose(out.action, [0.5, 0, 1, 0, -0.5, 0, -1])
    op.close()
    assert not any(d.is_open for d in hid.opened)


def test_takeover_and_handback_drive_a_metaworld_arm(tmp_path):
    from hal.drivers.metaworld import MetaWorldDriver

    hid = FakeHid()
    hid.plug()

    class Arm(MetaWorldDriver):
        def _apply_action(self, action):
            at()
            return super()._apply_action(action)

    # what the person does while step n runs is read at step n + 1
    at = AtStep(
        {
            1: lambda: hid.send(buttons(1), buttons(0), classic_translation(350, 0, 0)),
            3: lambda: hid.send(classic_translation(12, -20, 3), classic_rotation(0, 30, 0)),
            4: lambda: hid.send(buttons(2), buttons(0)),  # right button: close the gripper
            5: lambda: hid.send(buttons(1), buttons(0)),  # left again: hand back
        }
    )
    robot = Arm("sm-arm", task="reach-v3", max_episode_steps=9)
    op = make_spacemouse_operator({}, robot.action_features, hid=hid)
    assert op.slots == [0, 1, 2, 6]
    policy = BiasPolicy()
    policy.bias[:] = -0.25
    agent = make_agent(tmp_path, robot, policy, operator=op)
    agent.run(episodes=1)
    rows = spooled_rows(agent.uplink.spool)
    flags = rows.column("is_intervention").to_pylist()
    assert flags == [False] * 2 + [True] * 4 + [False] * 3
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    assert np.allclose(executed[2:6], [[1, 0, 0, -1], [1, 0, 0, -1], [0, 0, 0, -1], [0, 0, 0, 1]])
    assert np.allclose(executed[[0, 1, 6, 7, 8]], -0.25)
    assert op.takeovers == 1
    op.close()


def test_a_lost_spacemouse_holds_the_robot_and_comes_back(tmp_path, caplog):
    hid = FakeHid()
    hid.plug()
    at = AtStep(
        {
            1: lambda: hid.send(buttons(1), buttons(0), classic_translation(0, -350, 0)),
            2: lambda: hid.send(buttons(2)),  # gripper closed, then the cable comes out
            3: lambda: hid.unplug(),
            5: lambda: hid.plug(),
            6: lambda: hid.send(buttons(1), buttons(0)),  # back: the person hands back
        }
    )

    class Point(PointRobot):
        def _apply_action(self, action):
            at()
            return super()._apply_action(action)

    robot = Point(episode_steps=9)
    robot.spec = _robot(EE).spec.model_copy(update={"max_episode_steps": 9})
    op = make_spacemouse_operator({"reopen_s": 0}, robot.action_features, hid=hid)
    reasons: list[str] = []

    class Recorded:  # the operator, its reasons kept
        def step(self, obs: Any, proposed: np.ndarray) -> Any:
            out = op.step(obs, proposed)
            reasons.append(out.reason)
            return out

        def reset(self) -> None:
            op.reset()

        def close(self) -> None:
            op.close()

    agent = make_agent(tmp_path, robot, BiasPolicy(), operator=Recorded())
    with caplog.at_level(logging.WARNING, logger="edge_agent.spacemouse"):
        agent.run(episodes=1)  # the loss ends nothing
    rows = spooled_rows(agent.uplink.spool)
    assert rows.column("is_intervention").to_pylist() == [False] * 2 + [True] * 5 + [False] * 2
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    assert np.allclose(executed[2:4], [[0, 1, 0, -1], [0, 1, 0, 1]])
    # unplugged at step 4: the arm holds still, the gripper stays closed
    assert np.allclose(executed[4:7], [0, 0, 0, 1])
    assert reasons[4:6] == ["device_lost", "device_lost"] and reasons[6] == "spacemouse"
    assert op.losses == 1 and op.lost is None
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert lost and "SpaceMouse Compact (256f:c635) lost (OSError: read error)" in lost[0]
    assert "holding the robot still" in lost[0]
    op.close()


def test_a_joint_position_robot_is_refused_by_name():
    from hal.drivers.lerobot import LeRobotDriver

    robot = LeRobotDriver("arm-1", "fake_follower", {}, "tests.fakes.lerobot")
    with pytest.raises(
        ValueError, match=r"drives end-effector deltas \['delta_x'.*shoulder_pan\.pos"
    ):
        make_operator("spacemouse", 6, robot=robot)
    with pytest.raises(ValueError, match=r"nothing drives \['dx', 'dy'"):
        action_slots(_robot(["dx", "dy", "dz", "gripper"]).action_features)
    renamed = {"delta_x": "dx", "delta_y": "dy", "delta_z": "dz"}
    assert action_slots(_robot(["dx", "dy", "dz", "gripper"]).action_features, renamed) == [
        0,
        1,
        2,
        6,
    ]
    with pytest.raises(ValueError, match=r"nothing drives \['delta_z'\]"):
        action_slots(_robot(["delta_x", "delta_y", "gripper"]).action_features)


def test_a_missing_or_forbidden_spacemouse_is_refused_naming_what_was_looked_for():
    hid = FakeHid()
    hid.plug(b"/dev/hidraw0", ids=(0x046D, 0xC077), product="USB Optical Mouse", usage=(1, 2))
    feats = _robot(EE).action_features
    with pytest.raises(
        SpaceMouseUnavailable, match=r"looked for a SpaceMouse \(vendor 0x046d or 0x256f\)"
    ):
        make_spacemouse_operator({}, feats, hid=hid)
    with pytest.raises(SpaceMouseUnavailable, match=r"vendor 0x256f, product 0xc635"):
        make_spacemouse_operator({"vendor": "0x256f", "product": "0xc635"}, feats, hid=hid)
    hid.forbidden.add(hid.plug(b"/dev/hidraw5"))
    with pytest.raises(SpaceMouseUnavailable, match=r"/dev/hidraw5: cannot open it .*udev rule"):
        make_spacemouse_operator({}, feats, hid=hid)
    # the real hidapi (its hidraw build, for a /dev/hidraw path), imported when needed
    with pytest.raises(SpaceMouseUnavailable, match=r"/dev/hidraw-none: .*no such device node"):
        make_operator("spacemouse", 4, options={"path": "/dev/hidraw-none"}, robot=_robot(EE))
    with pytest.raises(ValueError, match="speed: not a spacemouse option"):
        make_spacemouse_operator({"speed": 2}, feats, hid=hid)
    with pytest.raises(ValueError, match=r"invert: \['roll'\] are not axes"):
        make_spacemouse_operator({"invert": "x,roll"}, feats, hid=hid)
    with pytest.raises(ValueError, match="takeover_button and gripper_button are both 1"):
        make_spacemouse_operator({"takeover_button": 1}, feats, hid=hid)


@pytest.mark.parametrize("backend", ["fake", "hidapi"])
def test_the_fake_keeps_hidapis_contract(backend):
    if backend == "hidapi":
        import hid as module
    else:
        module = FakeHid()
    found: Any = module.enumerate(0x256F, 0xFFFF)
    assert isinstance(found, list)
    device = module.device()
    with pytest.raises(ValueError, match="not open"):
        device.read(64)
    with pytest.raises(ValueError, match="not open"):
        device.set_nonblocking(1)
    with pytest.raises(OSError, match="open failed"):
        device.open_path(b"/dev/hidraw-no-such-node")
    device.close()
    device.close()


def test_robofleet_edge_takes_spacemouse_options():
    from robofleet.commands.edge import build_parser, options_from_args

    args = build_parser().parse_args(
        ["--operator", "spacemouse", "--operator-option", "vendor=0x256f"]
        + ["--operator-option", "deadzone=0.2", "--operator-option", "invert=ry,rz"]
    )
    opts = options_from_args(args)
    assert opts.operator == "spacemouse"
    assert opts.operator_options == {"vendor": "0x256f", "deadzone": 0.2, "invert": "ry,rz"}
