"""Pause and resume a run's robots through comms' Control stream, level-triggered.

A paused run keeps its leases; its robots hold at the next step boundary (the edge agent's
:class:`edge_agent.control.CloudControl`: nothing is commanded, the spool keeps draining, the
episode continues on resume). One pushed command can be lost: the robot is not connected at
that moment, or its agent restarts (a new agent starts unpaused). So the wanted state is
compared with what each robot's heartbeat reports (``stats["state"]``, written by comms'
registry) and the command is pushed again, at most every ``resend_s``, until they agree.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from foundation.store.metadata_store import MetadataStore
from runs.assignments import robot_views

log = logging.getLogger(__name__)


class RobotHold:
    """The pause state one run wants of its robots.

    Args:
        store: metadata store (robots' last heartbeat state).
        server: comms' ``CloudServer`` (``push_control``).
        run_id: the run (carried in each command).
        resend_s: shortest interval between two pushes to the same robot.
    """

    def __init__(
        self, store: MetadataStore, server: Any, run_id: str, resend_s: float = 2.0
    ) -> None:
        self.store = store
        self.server = server
        self.run_id = run_id
        self.resend_s = resend_s
        self.paused = False
        self._pushed_at: dict[str, float] = {}

    def want(self, paused: bool, robots: Mapping[str, int], reason: str) -> list[str]:
        """Set the wanted state and push it to every robot (name -> robot id) now.

        Returns:
            The robots whose Control stream took the command (others get it later).
        """
        self.paused = paused
        self._pushed_at.clear()
        return [name for name, rid in sorted(robots.items()) if self._push(name, rid, reason)]

    def follow(self, robots: Mapping[str, int]) -> list[str]:
        """Push the wanted state again to robots whose heartbeat disagrees.

        Returns:
            The robots that report holding (heartbeat state ``paused``), by name.
        """
        states = self.states(robots)
        for name, rid in robots.items():
            state = states.get(name)
            # Only a robot whose loop runs can be told anything; e-stopped or idle ones can't.
            disagrees = (state == "running") if self.paused else (state == "paused")
            if disagrees and time.monotonic() - self._pushed_at.get(name, -1e9) >= self.resend_s:
                self._push(name, rid, "re-sent: heartbeat reports " + str(state))
        return sorted(n for n, s in states.items() if s == "paused")

    def states(self, robots: Mapping[str, int]) -> dict[str, str | None]:
        """Each robot's last heartbeat state (``running``, ``paused``, ``estopped``, ``idle``
        ...; None before its first heartbeat). A robot paused by its own reset timeout
        (``edge_agent.resets``: stats ``reset_paused``) reads ``resetting``: the run did not
        pause it and a resume would not release it."""
        views = robot_views(self.store, list(robots))
        out: dict[str, str | None] = {}
        for name in robots:
            view = views.get(name)
            state = view.state if view is not None else None
            if view is not None and state == "paused" and view.stats.get("reset_paused"):
                state = "resetting"
            out[name] = state
        return out

    def _push(self, name: str, robot_id: int, reason: str) -> bool:
        kind = "pause" if self.paused else "resume"
        self._pushed_at[name] = time.monotonic()
        try:
            return bool(self.server.push_control(robot_id, kind, self.run_id, reason))
        except Exception as exc:  # the next follow() tries again
            log.warning("pushing %s to %s failed: %s", kind, name, exc)
            return False
