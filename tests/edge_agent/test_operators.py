"""Keyboard (pynput) and gamepad (pygame) operators, driven headless by injected events."""

from __future__ import annotations

import os

import numpy as np
import pytest

from edge_agent.operators import GamepadOperator, KeyboardOperator, make_operator
from tests.edge_agent.helpers import BiasPolicy, make_agent, spooled_rows
from tests.fakes.robot import PointRobot

OBS = {"observation.state": np.zeros(3, np.float32)}
NOVICE = np.zeros(4, np.float32)


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("PYNPUT_BACKEND", "dummy")  # no X display on CI
    from pynput.keyboard import Key, KeyCode

    return Key, KeyCode


class SpecialKey:
    """A special key as a real pynput backend delivers it (``Key.<name>``). pynput's dummy
    backend gives every ``Key`` member the same value, so ``Key.space`` is ``Key.alt`` there."""

    def __init__(self, name: str) -> None:
        self.name = name


def test_keyboard_takeover_drive_gripper_and_commands(keys):
    Key, KeyCode = keys
    op = KeyboardOperator(4, step_size=0.5, listen=False)
    assert not op.step(OBS, NOVICE).is_intervention
    op.on_press(KeyCode.from_char("t"))
    op.on_press(KeyCode.from_char("w"))
    op.on_press(KeyCode.from_char("d"))
    op.on_press(KeyCode.from_char("g"))
    out = op.step(OBS, NOVICE)
    assert out.is_intervention and out.reason == "key"
    assert np.allclose(out.action, [0.5, 0.5, 0.0, 1.0])
    op.on_release(KeyCode.from_char("w"))
    op.on_press(KeyCode.from_char("e"))
    assert np.allclose(op.step(OBS, NOVICE).action, [0.5, 0.0, -0.5, 1.0])
    op.on_press(KeyCode.from_char("r"))
    op.on_press(KeyCode.from_char("x"))
    op.on_press(KeyCode.from_char("y"))
    assert op.step(OBS, NOVICE).command == "rerecord"
    assert op.step(OBS, NOVICE).command == "discard"
    assert op.step(OBS, NOVICE).command == "success"
    op.on_press(SpecialKey("space"))  # hand back
    out = op.step(OBS, NOVICE)
    assert not out.is_intervention and out.action is None and out.command is None
    op.on_press(SpecialKey("esc"))
    op.on_press(KeyCode.from_char("k"))
    assert op.step(OBS, NOVICE).command == "estop"
    assert op.step(OBS, NOVICE).command == "estop"
    op.on_press(Key.alt)  # unmapped keys change nothing
    assert op.step(OBS, NOVICE) == op.step(OBS, NOVICE)


def test_keyboard_operator_in_the_loop_flags_exactly_the_keyed_steps(tmp_path, keys):
    Key, KeyCode = keys
    op = KeyboardOperator(4, step_size=1.0, listen=False)
    robot = PointRobot(episode_steps=6)

    class Scripted:
        """Presses keys at given steps, then asks the keyboard operator."""

        def __init__(self):
            self.n = 0

        def step(self, obs, proposed):
            if self.n == 2:
                op.on_press(KeyCode.from_char("t"))
                op.on_press(KeyCode.from_char("q"))
            if self.n == 4:
                op.on_press(KeyCode.from_char("t"))
            self.n += 1
            return op.step(obs, proposed)

        def reset(self):
            op.reset()

        def close(self):
            op.close()

    agent = make_agent(tmp_path, robot, BiasPolicy(), operator=Scripted())
    agent.run(episodes=1)
    agent.uplink.flush()
    rows = spooled_rows(agent.uplink.spool)
    assert rows.column("is_intervention").to_pylist() == [False, False, True, True, False, False]
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    assert np.allclose(executed[2], [0, 0, 1, -1]) and np.allclose(executed[0], 0)
    assert np.allclose(
        np.stack(rows.column("action.policy").to_numpy(zero_copy_only=False)[2:4]), 0
    )


def test_keyboard_listener_without_a_display_is_a_clear_error(monkeypatch):
    if os.environ.get("DISPLAY"):
        pytest.skip("a display is present: the xorg backend would work")
    monkeypatch.delenv("PYNPUT_BACKEND", raising=False)
    monkeypatch.setenv("PYNPUT_BACKEND_KEYBOARD", "xorg")
    import sys

    for mod in [m for m in sys.modules if m.startswith("pynput")]:
        monkeypatch.delitem(sys.modules, mod)
    with pytest.raises(RuntimeError, match="pynput"):
        KeyboardOperator(4, listen=True)


@pytest.fixture
def pg(monkeypatch):
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    import pygame

    yield pygame
    pygame.display.quit()


def post(pg, kind, **kw):
    pg.event.post(pg.event.Event(kind, joy=0, instance_id=0, **kw))


def test_gamepad_deadman_axes_gripper_and_buttons(pg):
    op = GamepadOperator(4, deadzone=0.1)
    assert not op.step(OBS, NOVICE).is_intervention
    post(pg, pg.JOYAXISMOTION, axis=0, value=0.6)
    post(pg, pg.JOYAXISMOTION, axis=1, value=-0.4)
    post(pg, pg.JOYAXISMOTION, axis=4, value=0.05)  # inside the deadzone
    post(pg, pg.JOYBUTTONDOWN, button=4)  # deadman
    post(pg, pg.JOYBUTTONDOWN, button=5)  # gripper closed while held
    out = op.step(OBS, NOVICE)
    assert out.is_intervention and out.reason == "button"
    assert np.allclose(out.action, [0.6, 0.4, 0.0, 1.0])
    post(pg, pg.JOYBUTTONUP, button=5)
    post(pg, pg.JOYBUTTONDOWN, button=2)
    out = op.step(OBS, NOVICE)
    assert np.allclose(out.action[3], -1.0) and out.command == "rerecord"
    post(pg, pg.JOYBUTTONUP, button=4)
    post(pg, pg.JOYBUTTONDOWN, button=0)
    out = op.step(OBS, NOVICE)
    assert not out.is_intervention and out.command == "success"
    post(pg, pg.JOYBUTTONDOWN, button=3)
    assert op.step(OBS, NOVICE).command == "discard"
    op.close()


def test_make_operator_names_the_choices():
    with pytest.raises(
        ValueError, match="none, scripted, keyboard, gamepad, remote, lerobot or spacemouse"
    ):
        make_operator("joystick", 4)
    with pytest.raises(ValueError, match="remote operator needs the robot"):
        make_operator("remote", 4)
    with pytest.raises(ValueError, match="expert"):
        make_operator("scripted", 4)


def test_scripted_operator_gates_on_the_actions_the_robot_can_execute():
    """Meta-World's experts command beyond [-1, 1]; clipped, they agree with the novice."""
    from edge_agent.gating import HGDaggerGate
    from edge_agent.operators import ScriptedOperator

    def expert(_obs):
        return np.array([10.0, -10.0, 0.0, 1.0], np.float32)

    novice = np.array([1.0, -1.0, 0.0, 1.0], np.float32)
    bounds = (np.full(4, -1.0, np.float32), np.full(4, 1.0, np.float32))
    clipped = ScriptedOperator(expert, HGDaggerGate(0.3, 5, "l2"), bounds=bounds)
    assert not clipped.step(OBS, novice).is_intervention
    # a real disagreement inside the bounds still hands control over, with the clipped label
    op = clipped.step(OBS, np.array([-1.0, 1.0, 0.0, 1.0], np.float32))
    assert op.is_intervention and np.array_equal(op.action, [1.0, -1.0, 0.0, 1.0])
    raw = ScriptedOperator(expert, HGDaggerGate(0.3, 5, "l2"))  # no bounds: raw expert action
    assert raw.step(OBS, novice).is_intervention


def test_keyboard_enter_signals_ready_once_and_not_before_the_reset(keys):
    Key, KeyCode = keys
    op = KeyboardOperator(4, listen=False)
    op.on_press(SpecialKey("enter"))  # during the episode: dropped when the reset begins
    op.reset_begins()
    assert not op.ready()
    op.on_press(SpecialKey("enter"))
    assert op.step(OBS, NOVICE).command is None  # not an episode command
    assert op.ready() and not op.ready()


def test_gamepad_start_button_signals_ready_once_and_not_before_the_reset(pg):
    op = GamepadOperator(4)
    post(pg, pg.JOYBUTTONDOWN, button=7)  # during the episode
    op.reset_begins()
    assert not op.ready()
    post(pg, pg.JOYBUTTONDOWN, button=7)
    assert op.ready() and not op.ready()
    op.close()
