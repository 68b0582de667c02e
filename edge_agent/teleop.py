"""LeRobot teleoperators as robofleet operators (``robofleet edge --operator lerobot``).

``--operator-option type=NAME`` picks a LeRobot ``TeleoperatorConfig`` by its registered choice
name (``so101_leader``, ``koch_leader``, ``openarm_leader``, ``gamepad``, ``keyboard_ee``,
``phone``, ...); every other option fills a field of that config (``port=/dev/ttyACM1``,
``id=left_leader``, ``use_gripper=false``), parsed to the field's type by draccus. The device is
built with LeRobot's ``make_teleoperator_from_config`` and connected once, when the agent is
built. robofleet's own options (not config fields):

* ``module``: a package to import first that registers ``type`` (a lab's own device).
* ``takeover_key`` (default ``space``): the key that switches between autonomous and taken
  over, read with LeRobot's ``create_key_listener`` (pynput on X11, else the terminal);
  ``none`` reads no key.
* ``takeover_pedal`` (an evdev code, e.g. ``KEY_A``) with ``pedal_device`` (its
  ``/dev/input/...`` path): a foot pedal toggles instead, read with LeRobot's
  ``start_pedal_listener``.
* ``action_map``: a JSON object ``{teleoperator key: robot action name or null}`` renaming the
  device's action keys onto the robot's per-dimension action names (null drops a key).
* ``handover_s`` (default 2.0): seconds an actuated leader takes to reach the follower.
* ``gripper_values`` (default ``[1, -1]`` for ``gamepad`` and ``keyboard_ee``): the robot's
  gripper action for LeRobot's close and open commands. Those devices give a gripper
  *command* (LeRobot's ``GripperAction``: 0 close, 1 stay, 2 open), not a position; the
  operator turns it into the robot's value, holding the last one on "stay" (a new episode
  starts open). ``none`` passes the device's value through.

Actions: the device's ``action_features`` name its keys (``{"shoulder_pan.pos": float, ...}``,
or ``{"dtype", "shape", "names"}`` for end-effector devices); each must name one dimension of
the robot's single ``action`` vector (its ``names``), and every robot dimension must be named,
else the build is refused naming the keys. While taken over, the executed action is the
device's, ``(A,) float32`` in the robot's order, and ``is_intervention`` is True.

Takeover without a jerk:

* A non-actuated device (keyboard_ee, gamepad, phone, the Koch and OpenArm leaders) takes
  over where the follower is: keyboard_ee and gamepad give *relative* actions (end-effector
  deltas, 0 = hold still), so the first taken-over step moves the follower from its current
  pose; a device that gives *absolute* targets (phone, Koch and OpenArm leader joints)
  commands the target it reports from the first taken-over step, and the robot's own LeRobot
  limits (``max_relative_target``) bound that step.
* An actuated leader (``feedback_features`` plus ``enable_torque`` / ``disable_torque``, as
  LeRobot's ``teleop_supports_feedback`` checks: the SO-100/SO-101 leaders, OpenArm Mini) is first driven to
  the follower's current pose (``observation.state`` by name) with LeRobot's
  ``teleop_smooth_move_to`` (its ``send_feedback`` path), then its torque is released for the
  person; on handback its torque holds it. The control loop waits for the move (the follower
  holds, as in LeRobot's DAgger rollout). No leader arm's motor bus can run here, so this
  path is tested with a LeRobot ``Teleoperator`` subclass standing in for the arm.

The device's own episode events (``get_teleop_events``, where it has them: keyboard_ee's
``s`` / ``r`` / ``q``, the gamepad's buttons) become the commands ``success``, ``rerecord``
and ``failure``. Enter on the takeover keyboard says the cell is set up again after a reset
by hand (``edge_agent.resets``). LeRobot's keyboard_ee forgets pressed keys with each events
read, so a key moves the robot for the step after its press (a held key goes on by the
keyboard's autorepeat).

A device that stops answering (unplugged, its bus lost) never ends the run: while taken over
the robot holds (end-effector deltas of 0, or the follower's own pose for joint targets) with
the reason ``device_lost``; an autonomous robot goes on; each step tries the device again.

LeRobot 0.6's ``keyboard`` type reports pressed keys, not an action, and is refused; its
``keyboard_ee`` type gives end-effector deltas.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.core import Observation, OperatorInput
from edge_agent.teleop_mapping import (
    action_order,
    device_action_names,
    feedback_index,
    gripper_command,
    robot_action_names,
    state_indices,
    teleoperator_config,
)

log = logging.getLogger(__name__)

# LeRobot's GripperAction values (gamepad, keyboard_ee).
CLOSE, STAY, OPEN = 0, 1, 2


class TeleoperatorUnavailable(ValueError):
    """The teleoperator could not be connected, is not calibrated, or stopped answering; the
    message names the device and what to do."""


class LeRobotOperator:
    """A LeRobot ``Teleoperator`` behind robofleet's ``InterventionSource``.

    Args:
        teleop: a connected LeRobot ``Teleoperator``.
        name: the device as messages name it (e.g. ``so101_leader on /dev/ttyACM1``).
        keys: for each robot action dimension, the device key that fills it (``action_order``).
        feedback: for an actuated leader, device feedback key -> index in the follower's
            ``observation.state`` (None: not actuated, or not driven to the follower).
        handover_s: seconds the leader takes to reach the follower (LeRobot's interpolation).
        takeover_key: the key name that toggles takeover (``on_key``).
        gripper: ``(index in keys, close value, open value)`` when the device gives LeRobot's
            gripper command (``teleop_mapping.GRIPPER_COMMAND_TYPES``), else None.
        hold_state: for joint-target robots, each action dimension's index in
            ``observation.state`` (a lost device holds the follower there); None: the
            actions are deltas and a lost device holds with zeros.

    ``toggle`` / ``on_key`` may be called from any thread (a key or pedal listener); the
    takeover or handback happens at the next ``step``. A device that stops answering holds
    the robot while taken over (reason ``device_lost``, ``lost`` says why) and is read again
    each step.
    """

    def __init__(
        self,
        teleop: Any,
        name: str,
        keys: Sequence[str],
        *,
        feedback: Mapping[str, int] | None = None,
        handover_s: float = 2.0,
        takeover_key: str | None = "space",
        gripper: tuple[int, float, float] | None = None,
        hold_state: Sequence[int] | None = None,
    ) -> None:
        self.teleop = teleop
        self.name = name
        self.keys = list(keys)
        self.feedback = dict(feedback) if feedback is not None else None
        self.handover_s = handover_s
        self.takeover_key = takeover_key
        self.active = False
        self.takeovers = 0
        self.listeners: list[Any] = []
        self._lock = threading.Lock()
        self._flip = False
        self._ready = False
        self.gripper = gripper
        self._grip = gripper[2] if gripper else 0.0
        self.hold_state = list(hold_state) if hold_state is not None else None
        self.lost: str | None = None

    def toggle(self) -> None:
        """Switch between autonomous and taken over at the next step (a second call before
        that step cancels the first)."""
        with self._lock:
            self._flip = not self._flip

    def on_key(self, key: str) -> None:
        """A key name from LeRobot's key listener (``space``, ``enter``, a character)."""
        if key == self.takeover_key:
            self.toggle()
        elif key == "enter":
            with self._lock:
                self._ready = True

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput:
        with self._lock:
            flip, self._flip = self._flip, False
        if flip and not self.active:
            self._take_over(observation)
        elif flip:
            self._hand_back()
        try:
            raw, command = self._read()
        except TeleoperatorUnavailable as exc:
            if self.lost is None:
                log.warning("%s; %s", exc, "holding" if self.active else "the policy goes on")
            self.lost = str(exc)
            if not self.active:
                return OperatorInput(False, None, None, "")
            return OperatorInput(True, self._hold(observation), None, "device_lost")
        if self.lost is not None:
            log.warning("teleoperator %s answers again", self.name)
            self.lost = None
        if not self.active:
            return OperatorInput(False, None, command, "")
        action = np.asarray([float(raw[k]) for k in self.keys], dtype=np.float32)
        if self.gripper is not None:
            index, close, open_ = self.gripper
            command_value = round(float(action[index]))
            if command_value == CLOSE:
                self._grip = close
            elif command_value == OPEN:
                self._grip = open_
            action[index] = self._grip
        return OperatorInput(True, action, command, "teleop")

    def _hold(self, observation: Observation) -> np.ndarray:
        """The action that keeps the robot where it is: the follower's pose for joint
        targets, zero deltas (the gripper as last commanded) otherwise."""
        if self.hold_state is not None:
            state = np.asarray(observation["observation.state"], dtype=np.float32)
            return state[self.hold_state].astype(np.float32)
        action = np.zeros(len(self.keys), dtype=np.float32)
        if self.gripper is not None:
            action[self.gripper[0]] = self._grip
        return action

    def _read(self) -> tuple[Mapping[str, Any], str | None]:
        """The device's action (read every step, which also drains its event queue) and
        the episode command its events give."""
        try:
            raw = self.teleop.get_action()
            events = (
                self.teleop.get_teleop_events() if hasattr(self.teleop, "get_teleop_events") else {}
            )
        except Exception as exc:  # serial, HID and listener errors vary by device
            raise TeleoperatorUnavailable(
                f"teleoperator {self.name} stopped answering ({type(exc).__name__}: {exc}); "
                "check its cable and power, then restart the robot's agent"
            ) from exc
        from lerobot.teleoperators import TeleopEvents

        command = None
        if events.get(TeleopEvents.SUCCESS):
            command = "success"
        elif events.get(TeleopEvents.RERECORD_EPISODE):
            command = "rerecord"
        elif events.get(TeleopEvents.TERMINATE_EPISODE):
            command = "failure"
        return raw, command

    def _take_over(self, observation: Observation) -> None:
        if self.feedback is not None:
            from lerobot.common.control_utils import teleop_smooth_move_to

            state = np.asarray(observation["observation.state"], dtype=np.float64)
            target = {k: float(state[i]) for k, i in self.feedback.items()}
            teleop_smooth_move_to(self.teleop, target, duration_s=self.handover_s)
            self.teleop.disable_torque()  # the person moves it from here
        self.active = True
        self.takeovers += 1

    def _hand_back(self) -> None:
        self.active = False
        if self.feedback is not None:
            try:
                self.teleop.enable_torque()  # the leader holds where the person left it
            except Exception as exc:  # a lost bus: the robot is autonomous regardless
                log.warning("teleoperator %s: torque not re-enabled (%s)", self.name, exc)

    def reset(self) -> None:
        """A new episode starts autonomous, its gripper open."""
        with self._lock:
            self._flip = False
        if self.gripper is not None:
            self._grip = self.gripper[2]
        if self.active:
            self._hand_back()

    def reset_begins(self) -> None:
        """A reset hold starts: an Enter pressed during the episode means nothing."""
        with self._lock:
            self._ready = False

    def ready(self) -> bool:
        """Enter was pressed since :meth:`reset_begins` (taken once)."""
        with self._lock:
            ready, self._ready = self._ready, False
            return ready

    def close(self) -> None:
        for listener in self.listeners:
            stop = getattr(listener, "stop", None)
            if callable(stop):
                stop()
        if self.teleop.is_connected:
            self.teleop.disconnect()


def _device_name(config: Any) -> str:
    port = getattr(config, "port", None)
    return (
        f"{config.type}"
        + (f" on {port}" if port else "")
        + (f" (id {config.id})" if config.id else "")
    )


def _connect(teleop: Any, config: Any, name: str) -> None:
    """Connect without prompting (a fleet robot has no one at its terminal to calibrate)."""
    calibrate_cmd = (
        f"lerobot-calibrate --teleop.type={config.type}"
        + (f" --teleop.port={config.port}" if getattr(config, "port", None) else "")
        + (f" --teleop.id={config.id}" if config.id else "")
    )
    try:
        if "calibrate" in inspect.signature(teleop.connect).parameters:
            teleop.connect(calibrate=False)
        else:
            teleop.connect()
    except Exception as exc:  # serial, HID, camera and permission errors vary by device
        raise TeleoperatorUnavailable(
            f"teleoperator {name}: LeRobot could not connect it ({type(exc).__name__}: {exc}); "
            "check that it is plugged in and powered, the port and its permissions, and that it "
            f"is calibrated ({calibrate_cmd})"
        ) from exc
    if not teleop.is_connected:
        raise TeleoperatorUnavailable(
            f"teleoperator {name}: not connected after LeRobot's connect(); a keyboard needs an X11 "
            "session (pynput), a gamepad must be plugged in"
        )
    if teleop.is_calibrated is False:
        teleop.disconnect()
        raise TeleoperatorUnavailable(f"teleoperator {name}: not calibrated; run {calibrate_cmd}")
    try:  # one read: a device LeRobot calls connected may still be absent (no gamepad found)
        teleop.get_action()
    except Exception as exc:  # serial, HID and listener errors vary by device
        with contextlib.suppress(Exception):
            teleop.disconnect()
        raise TeleoperatorUnavailable(
            f"teleoperator {name}: connected but reading it failed ({type(exc).__name__}: {exc}); "
            "check that it is plugged in and powered"
        ) from exc


def make_lerobot_operator(
    options: Mapping[str, Any],
    action_features: Mapping[str, Any],
    observation_features: Mapping[str, Any],
    *,
    listen: bool = True,
) -> LeRobotOperator:
    """Build, check and connect the teleoperator ``options`` name (see the module doc).

    Args:
        options: ``--operator-option`` pairs, parsed (``hal.drivers.parse_options``).
        action_features / observation_features: the robot's (a hal driver's) feature dicts.
        listen: start the takeover key / pedal listener; tests pass False and call
            ``on_key`` / ``toggle``.

    Raises:
        ValueError: a bad option (unknown type or field), or actions that do not match.
        TeleoperatorUnavailable: the device could not be connected or is not calibrated.
    """
    from lerobot.teleoperators import make_teleoperator_from_config

    config = teleoperator_config(options)
    action_map = options.get("action_map") or {}
    if isinstance(action_map, str):
        try:
            action_map = json.loads(action_map)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--operator-option action_map: not JSON ({exc})") from None
    if not isinstance(action_map, Mapping):
        raise ValueError(
            f"--operator-option action_map: expected a JSON object, got {action_map!r}"
        )
    handover_s = float(options.get("handover_s", 2.0))
    name = _device_name(config)
    try:
        teleop = make_teleoperator_from_config(config)
    except Exception as exc:  # a missing optional dependency of the device (pynput, hidapi...)
        raise TeleoperatorUnavailable(
            f"teleoperator {name}: LeRobot could not build it: {exc}"
        ) from exc
    keys = action_order(
        device_action_names(teleop, config.type), robot_action_names(action_features), action_map
    )
    feedback = None
    if teleop.feedback_features:
        from lerobot.common.control_utils import teleop_supports_feedback

        if teleop_supports_feedback(teleop):
            feedback = feedback_index(teleop, action_map, observation_features, name)
    takeover_key = options.get("takeover_key", "space")
    takeover_key = None if takeover_key in (None, "none") else str(takeover_key)
    gripper = gripper_command(config.type, keys, options.get("gripper_values", "default"))
    hold_state = state_indices(robot_action_names(action_features), observation_features)
    _connect(teleop, config, name)
    op = LeRobotOperator(
        teleop,
        name,
        keys,
        feedback=feedback,
        handover_s=handover_s,
        takeover_key=takeover_key,
        gripper=gripper,
        hold_state=hold_state,
    )
    if listen:
        _listen(op, options)
    return op


def _listen(op: LeRobotOperator, options: Mapping[str, Any]) -> None:
    """Start the takeover pedal and/or key listener (LeRobot's own).

    Raises:
        TeleoperatorUnavailable: nothing can toggle takeover here (no pedal, and no display
            or terminal to read the key from).
    """
    pedal = options.get("takeover_pedal")
    if pedal:
        from lerobot.utils.pedal import start_pedal_listener

        device = options.get("pedal_device")
        if not device:
            raise ValueError("--operator-option takeover_pedal needs pedal_device=/dev/input/...")
        if not Path(str(device)).exists():
            raise TeleoperatorUnavailable(
                f"takeover pedal {device}: no such device; check its path"
            )

        def on_pedal(code: str) -> None:
            if code == pedal:
                op.toggle()

        thread = start_pedal_listener(on_pedal, device_path=str(device))
        if thread is None:
            raise TeleoperatorUnavailable(
                f"takeover pedal {device}: LeRobot could not read it (evdev)"
            )
        op.listeners.append(thread)
    if op.takeover_key is not None:
        from lerobot.utils.keyboard_input import create_key_listener

        listener = create_key_listener(op.on_key, controls_help=f"{op.takeover_key}: takeover")
        if listener is not None:
            op.listeners.append(listener)
        elif not pedal:
            op.close()
            raise TeleoperatorUnavailable(
                f"takeover key {op.takeover_key!r}: no keyboard to read it from (no X11 display and "
                "stdin is not a terminal); run in a terminal, or use a foot pedal "
                "(--operator-option takeover_pedal=KEY_A pedal_device=/dev/input/...)"
            )


__all__: Sequence[str] = (
    "LeRobotOperator",
    "TeleoperatorUnavailable",
    "action_order",
    "make_lerobot_operator",
    "teleoperator_config",
)
