"""Resets by people: a robot that cannot reset itself waits for its operator between episodes.

A robot whose spec says ``capabilities.can_reset: false`` (an arm: LeRobot, ROS 2) would start
its next episode from wherever the last one left it. Instead, after an episode in which it
moved, the control loop holds: no action is sent, the heartbeat state is ``resetting``, the
uplink keeps draining. It goes on when its operator signals **ready**:

* a key or button of the intervention source (:class:`edge_agent.core.ReadySource`: the
  keyboard's Enter, the gamepad's start button, a simulated person after a delay);
* the dashboard's Ready button: a ``ready`` command on the robot's Control stream
  (:meth:`edge_agent.control.CloudControl.take_ready`), or :meth:`EdgeAgent.ready` locally.

A ready given while the episode still ran is dropped when the hold begins: it cannot mean that
the cell was set up after the episode.

**The first episode needs no ready**: the cell is set up before the agent starts (before the
run is launched, or before a robot computer is restarted), and an episode that never sent an
action (e-stopped before its first step) leaves the cell as it was. What needs a reset is any
action sent since the last ready.

After ``edge.reset_timeout_s`` of holding without ready the robot is **paused** (heartbeat state
``paused``, this robot alone: the run and its other robots go on) and still waits for ready.
A cloud e-stop or pause and the agent's stop interrupt the hold (the loop honours them and
comes back to it); the time held counts toward the timeout only while the hold itself runs.

Robots with ``can_reset: true`` never hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from edge_agent.control import CloudControl
from edge_agent.core import ReadySource

log = logging.getLogger(__name__)


def needs_person(driver: Any) -> bool:
    """Whether ``driver``'s spec says it cannot reset itself (``capabilities.can_reset``
    false). A driver that declares no capabilities resets itself, as simulators do."""
    caps = getattr(driver, "capabilities", None)
    if isinstance(caps, dict):
        return not bool(caps.get("can_reset", True))
    return not bool(getattr(caps, "can_reset", True))


class ResetHold:
    """The hold between two episodes of a robot that a person resets.

    Args:
        enabled: the robot cannot reset itself (:func:`needs_person`); False: never holds.
        control: the robot's cloud control (its ``ready`` command; e-stop and pause interrupt).
        operator: the intervention source; polled when it is a :class:`ReadySource`.
        stop: the agent's stop event (interrupts).
        timeout_s: seconds of holding before the robot is paused (None: never).
        poll_s: how often the operator's ``ready`` is polled (a cloud command wakes at once).

    Attributes:
        needed: an action was sent since the cell was last set up: the next episode waits.
        timed_out: the current hold passed ``timeout_s`` (the robot reports ``paused``).
        timeouts: how many holds passed ``timeout_s``.
    """

    def __init__(
        self,
        enabled: bool,
        control: CloudControl,
        operator: Any,
        stop: threading.Event,
        timeout_s: float | None,
        poll_s: float = 0.05,
    ) -> None:
        self.enabled = enabled
        self.control = control
        self.operator = operator
        self.stop = stop
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.needed = False
        self.timed_out = False
        self.timeouts = 0
        self._held = 0.0  # seconds the current reset has held so far
        self._begun = False  # the current reset's hold has started

    def moved(self) -> None:
        """The robot executed an action: the cell needs setting up before the next episode."""
        if self.enabled:
            self.needed = True

    def wait(self, account: Callable[[float], object], on_timeout: Callable[[], object]) -> bool:
        """Hold until ready, an interruption (e-stop, pause, stop) or nothing is needed.

        Args:
            account: called with each increment of seconds held (the reset time, as it grows).
            on_timeout: called once when the hold passes ``timeout_s`` (e.g. a heartbeat now).

        Returns:
            True when ready arrived (the reset is over); False when interrupted (call again
            after the interruption: the same reset goes on, its time and timeout kept).
        """
        if not self.needed:
            return True
        if not self._begun:  # a fresh reset: presses made during the episode mean nothing
            self._begun, self._held = True, 0.0
            self.control.take_ready()
            if isinstance(self.operator, ReadySource):
                self.operator.reset_begins()
        last = time.monotonic()
        while True:
            now = time.monotonic()
            account(now - last)
            self._held += now - last
            last = now
            if self._ready():
                self.needed = self._begun = self.timed_out = False
                return True
            if self.stop.is_set() or self.control.holding:
                return False
            if self.timeout_s is not None and self._held >= self.timeout_s and not self.timed_out:
                self.timed_out = True
                self.timeouts += 1
                log.warning(
                    "no ready after %.0f s of reset: robot paused until its operator signals ready",
                    self._held,
                )
                on_timeout()
            self.control.wait(self.poll_s)

    def _ready(self) -> bool:
        if self.control.take_ready():
            return True
        return isinstance(self.operator, ReadySource) and bool(self.operator.ready())
