"""Intervention sources: who may take over a step (see ``edge_agent.core.InterventionSource``).

* :class:`NoOperator` - nobody watches; the policy always acts.
* :class:`ScriptedOperator` - the simulated operator: a scripted expert (Meta-World's policy for
  the task) behind HG-DAgger gating (:class:`edge_agent.gating.HGDaggerGate`).
* :class:`KeyboardOperator` - a person at a keyboard (pynput). Keys: ``space`` (or ``t``)
  takes over / hands back; ``w``/``s``, ``a``/``d``, ``q``/``e`` drive action dims 1, 0, 2 (+/-); ``g``
  toggles the gripper (dim 3); ``r`` rerecords the episode (ends it, discards it, records its
  task again); ``x`` discards it (ends it, the schedule goes on); ``y`` / ``n`` label it
  success / failure (and end it); ``enter`` says the cell is set up again after a reset by
  hand (``edge_agent.resets``); ``esc`` (or ``k``) e-stops.
* ``lerobot`` - any LeRobot teleoperator (leader arms, gamepad, keyboard_ee, phone), built by
  LeRobot's factory: ``edge_agent.teleop``.
* ``spacemouse`` - a 3Dconnexion SpaceMouse (hidapi) giving end-effector deltas:
  ``edge_agent.spacemouse``.
* ``remote`` - a person at the dashboard's operator station, in a browser, through the
  cloud's Control stream: ``edge_agent.remote``.
* :class:`GamepadOperator` - a person with a gamepad (pygame joystick events). Hold the
  deadman button (default 4, left bumper) to take over; axes drive action dims; buttons label
  success (0), failure (1), rerecord (2), discard (3); button 5 closes the gripper while held;
  start (7) says the cell is set up again after a reset by hand.

A discarded or rerecorded episode is never trained on: its steps stay out of the buffer or
are marked there (``edge_agent.agent``, ``buffer.table.marks``). The cloud sends the same two
commands over the robot's Control stream (``edge_agent.control``).

Keyboard and gamepad are driven by events, so they are tested headless by injecting events
(``KeyboardOperator.on_press`` / ``on_release``; ``pygame.event.post`` with
``SDL_VIDEODRIVER=dummy``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from edge_agent.core import Observation, OperatorInput
from edge_agent.gating import HGDaggerGate

Expert = Callable[[Mapping[str, Any]], np.ndarray]


class NoOperator:
    """Nobody takes over."""

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput:
        return OperatorInput()

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


class ScriptedOperator:
    """The simulated operator: a scripted expert gated by HG-DAgger's takeover rule.

    Args:
        expert: ``observation -> action (A,)`` (a driver's, ``hal.driver.ScriptedExpertDriver``).
        gate: the takeover / handback rule (thresholds are ``edge:`` settings).
        state_key: the observation entry the gate's risk regions look at.
        bounds: ``(low, high)`` of the robot's action (its spec's ``action_low/high``). The
            gate then compares the two actions the robot could really execute, both clipped
            (as the synchronous HG-DAgger loop does): Meta-World's scripted experts command
            far beyond [-1, 1], and an unclipped label would count as disagreement what the
            robot executes identically. The returned label is the clipped one.
    """

    def __init__(
        self,
        expert: Expert,
        gate: HGDaggerGate,
        state_key: str = "observation.state",
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.expert = expert
        self.gate = gate
        self.state_key = state_key
        self.bounds = bounds
        self.takeovers = 0

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput:
        label = np.asarray(self.expert(observation), dtype=np.float32)
        if self.bounds is not None:
            low, high = self.bounds
            label = np.clip(label, low, high).astype(np.float32)
            proposed = np.clip(proposed, low, high)
        was = self.gate.expert_in_control
        d = self.gate.decide(proposed, label, observation.get(self.state_key))
        if d.expert_in_control and not was:
            self.takeovers += 1
        if d.expert_in_control:
            return OperatorInput(True, label, None, d.reason)
        return OperatorInput(False, None, None, d.reason)

    def demonstrate(self, observation: Observation) -> OperatorInput:
        """A demonstration step: the expert acts, no gate (the operator drives the episode)."""
        label = np.asarray(self.expert(observation), dtype=np.float32)
        if self.bounds is not None:
            label = np.clip(label, *self.bounds).astype(np.float32)
        return OperatorInput(True, label, None, "demonstration")

    def reset(self) -> None:
        self.gate.reset()

    def close(self) -> None:
        pass


class _HumanState:
    """Thread-safe state shared by an input thread and the control loop."""

    def __init__(self, action_dim: int) -> None:
        self.lock = threading.Lock()
        self.active = False
        self.axes = np.zeros(action_dim, np.float32)
        self.commands: list[str] = []
        self.ready = False  # "ready" pressed since the reset hold began (edge_agent.resets)

    def reset_begins(self) -> None:
        with self.lock:
            self.ready = False

    def take_ready(self) -> bool:
        with self.lock:
            ready, self.ready = self.ready, False
            return ready

    def take(self) -> tuple[bool, np.ndarray, str | None]:
        with self.lock:
            cmd = self.commands.pop(0) if self.commands else None
            return self.active, self.axes.copy(), cmd


class KeyboardOperator:
    """A keyboard operator (pynput). See the module doc for the keys.

    Args:
        action_dim: A (at least 3; dim 3 is the gripper when present).
        step_size: magnitude of one key's action component.
        listen: start pynput's global listener (needs a display or ``PYNPUT_BACKEND``); tests
            pass False and inject events.

    Raises:
        RuntimeError: ``listen`` is True but pynput has no usable backend here (no X display).
    """

    _AXES = {
        "d": (0, 1.0),
        "a": (0, -1.0),
        "w": (1, 1.0),
        "s": (1, -1.0),
        "q": (2, 1.0),
        "e": (2, -1.0),
    }
    _COMMANDS = {"r": "rerecord", "x": "discard", "y": "success", "n": "failure"}

    def __init__(self, action_dim: int, step_size: float = 1.0, listen: bool = True) -> None:
        self.state = _HumanState(action_dim)
        self.step_size = step_size
        self.gripper = -1.0
        self._held: set[str] = set()
        self._listener: Any = None
        if listen:
            try:
                from pynput import keyboard
            except ImportError as exc:
                raise RuntimeError(
                    f"keyboard operator needs pynput with a display or PYNPUT_BACKEND set: {exc}"
                ) from None
            self._listener = keyboard.Listener(on_press=self.on_press, on_release=self.on_release)
            self._listener.start()

    @staticmethod
    def _name(key: Any) -> str:
        char = getattr(key, "char", None)
        if char:
            return str(char).lower()
        name = getattr(key, "name", None)
        return str(name) if name else str(key)

    def on_press(self, key: Any) -> None:
        """pynput callback (also the test's injection point)."""
        name = self._name(key)
        with self.state.lock:
            if name in ("space", "t"):
                self.state.active = not self.state.active
            elif name in ("esc", "k"):
                self.state.commands.append("estop")
            elif name == "enter":
                self.state.ready = True
            elif name == "g":
                self.gripper = -self.gripper
            elif name in self._COMMANDS:
                self.state.commands.append(self._COMMANDS[name])
            elif name in self._AXES:
                self._held.add(name)
            self._recompute()

    def on_release(self, key: Any) -> None:
        name = self._name(key)
        with self.state.lock:
            self._held.discard(name)
            self._recompute()

    def _recompute(self) -> None:
        axes = np.zeros_like(self.state.axes)
        for k in self._held:
            dim, sign = self._AXES[k]
            if dim < axes.shape[0]:
                axes[dim] += sign * self.step_size
        if axes.shape[0] > 3:
            axes[3] = self.gripper
        self.state.axes = axes

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput:
        active, axes, cmd = self.state.take()
        if active:
            return OperatorInput(True, axes, cmd, "key")
        return OperatorInput(False, None, cmd, "")

    def reset(self) -> None:
        with self.state.lock:
            self.state.active = False
            self._held.clear()
            self._recompute()

    def reset_begins(self) -> None:
        """A reset hold starts: an Enter pressed during the episode means nothing."""
        self.state.reset_begins()

    def ready(self) -> bool:
        """Enter was pressed since :meth:`reset_begins` (taken once)."""
        return self.state.take_ready()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.stop()


class GamepadOperator:
    """A gamepad operator (pygame joystick events, polled once per control step).

    Args:
        action_dim: A.
        axis_map: joystick axis -> (action dim, sign). Default: left stick x/y -> dims 0/1,
            right stick y -> dim 2.
        deadman_button / gripper_button: held to take over / to close the gripper (dim 3).
        command_buttons: button -> ``success`` / ``failure`` / ``rerecord`` / ``discard`` /
            ``estop`` / ``ready`` (the cell is set up again, ``edge_agent.resets``).
        deadzone: stick values below this magnitude read as 0.

    pygame needs a video driver for its event queue; on a headless robot computer the dummy
    driver is used (``SDL_VIDEODRIVER=dummy`` unless already set).
    """

    def __init__(
        self,
        action_dim: int,
        axis_map: Mapping[int, tuple[int, float]] | None = None,
        deadman_button: int = 4,
        gripper_button: int = 5,
        command_buttons: Mapping[int, str] | None = None,
        deadzone: float = 0.1,
    ) -> None:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        import pygame

        self.pg = pygame
        pygame.display.init()
        pygame.joystick.init()
        self.sticks = [pygame.joystick.Joystick(i) for i in range(pygame.joystick.get_count())]
        self.state = _HumanState(action_dim)
        self.axis_map = (
            dict(axis_map) if axis_map is not None else {0: (0, 1.0), 1: (1, -1.0), 4: (2, -1.0)}
        )
        self.deadman_button = deadman_button
        self.gripper_button = gripper_button
        self.command_buttons = (
            dict(command_buttons)
            if command_buttons is not None
            else {0: "success", 1: "failure", 2: "rerecord", 3: "discard", 7: "ready", 8: "estop"}
        )
        self.deadzone = deadzone
        self._raw = np.zeros(action_dim, np.float32)
        self._gripper = -1.0

    def _pump(self) -> None:
        pg = self.pg
        for ev in pg.event.get((pg.JOYAXISMOTION, pg.JOYBUTTONDOWN, pg.JOYBUTTONUP)):
            if ev.type == pg.JOYAXISMOTION and ev.axis in self.axis_map:
                dim, sign = self.axis_map[ev.axis]
                if dim < self._raw.shape[0]:
                    v = float(ev.value)
                    self._raw[dim] = 0.0 if abs(v) < self.deadzone else sign * v
            elif ev.type == pg.JOYBUTTONDOWN:
                if ev.button == self.deadman_button:
                    self.state.active = True
                elif ev.button == self.gripper_button:
                    self._gripper = 1.0
                elif self.command_buttons.get(ev.button) == "ready":
                    self.state.ready = True
                elif ev.button in self.command_buttons:
                    self.state.commands.append(self.command_buttons[ev.button])
            elif ev.type == pg.JOYBUTTONUP:
                if ev.button == self.deadman_button:
                    self.state.active = False
                elif ev.button == self.gripper_button:
                    self._gripper = -1.0
        axes = self._raw.copy()
        if axes.shape[0] > 3:
            axes[3] = self._gripper
        self.state.axes = axes

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput:
        with self.state.lock:
            self._pump()
        active, axes, cmd = self.state.take()
        if active:
            return OperatorInput(True, axes, cmd, "button")
        return OperatorInput(False, None, cmd, "")

    def reset(self) -> None:
        pass

    def reset_begins(self) -> None:
        """A reset hold starts: a start press during the episode means nothing."""
        with self.state.lock:
            self._pump()  # presses queued during the episode are read (and dropped) now
        self.state.reset_begins()

    def ready(self) -> bool:
        """The ready button was pressed since :meth:`reset_begins` (taken once); reads the
        gamepad's events, as no step does while the robot holds."""
        with self.state.lock:
            self._pump()
        return self.state.take_ready()

    def close(self) -> None:
        for s in self.sticks:
            s.quit()


def make_operator(
    kind: str,
    action_dim: int,
    *,
    expert: Expert | None = None,
    gate: HGDaggerGate | None = None,
    bounds: tuple[np.ndarray, np.ndarray] | None = None,
    options: Mapping[str, Any] | None = None,
    robot: Any = None,
) -> Any:
    """Build an intervention source by name: ``none``, ``scripted``, ``keyboard``, ``gamepad``,
    ``remote`` (the dashboard's station, ``edge_agent.remote``; ``edge_agent.build`` attaches
    it to the agent's Control stream), ``lerobot`` or ``spacemouse`` (``bounds``: the action
    bounds the scripted operator gates within; ``options``: the lerobot or spacemouse
    operator's ``--operator-option`` pairs and ``robot`` the driver whose action features it
    maps onto, ``edge_agent.teleop`` / ``edge_agent.spacemouse``).

    Raises:
        ValueError: unknown ``kind``, ``scripted`` without an expert and a gate, options for
            an operator that takes none, or a lerobot or spacemouse operator that cannot be
            built (``edge_agent.teleop.make_lerobot_operator``,
            ``edge_agent.spacemouse.make_spacemouse_operator``).
    """
    if options and kind not in ("lerobot", "spacemouse"):
        raise ValueError(f"--operator-option is for --operator lerobot or spacemouse, not {kind}")
    if kind == "spacemouse":
        if robot is None:
            raise ValueError("the spacemouse operator needs the robot whose actions it gives")
        from edge_agent.spacemouse import make_spacemouse_operator

        return make_spacemouse_operator(options or {}, robot.action_features)
    if kind == "lerobot":
        if robot is None:
            raise ValueError("the lerobot operator needs the robot whose actions it gives")
        from edge_agent.teleop import make_lerobot_operator

        return make_lerobot_operator(
            options or {}, robot.action_features, robot.observation_features
        )
    if kind == "remote":
        if robot is None:
            raise ValueError("the remote operator needs the robot whose actions it gives")
        from edge_agent.remote import RemoteOperator

        return RemoteOperator(robot.action_features["action"])
    if kind == "none":
        return NoOperator()
    if kind == "scripted":
        if expert is None or gate is None:
            raise ValueError("the scripted operator needs an expert and a gate")
        return ScriptedOperator(expert, gate, bounds=bounds)
    if kind == "keyboard":
        return KeyboardOperator(action_dim)
    if kind == "gamepad":
        return GamepadOperator(action_dim)
    raise ValueError(
        f"unknown operator {kind!r}; choose none, scripted, keyboard, gamepad, remote, lerobot "
        "or spacemouse"
    )


__all__: Sequence[str] = (
    "GamepadOperator",
    "KeyboardOperator",
    "NoOperator",
    "ScriptedOperator",
    "make_operator",
)
