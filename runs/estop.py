"""E-stop state of the fleet pushed to the robots, level-triggered (the cloud side of safety).

An operator e-stops a robot in the dashboard, the CLI or the REST API: the metadata store says
ESTOPPED. That must reach the robot's edge agent (comms' Control stream; the agent latches its
driver within one control period, see :mod:`edge_agent.control`) even when the dashboard runs
in another process, the robot was disconnected at that moment, or its agent restarted. So the
cloud compares each robot's status in the store with the state its heartbeat reports and pushes
``estop`` to a robot that should be stopped and does not say so, and ``clear_estop`` to one that
says it is stopped after an operator cleared it, again at most every ``resend_s`` until they
agree. A robot that e-stopped itself (a hardware button) reports it first; comms' registry then
marks it ESTOPPED, and it stays so until an operator clears it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import select

from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Robot, RobotStatus

log = logging.getLogger(__name__)


class EstopSync:
    """Keeps robots' e-stop latches equal to their status in the store.

    Args:
        store: metadata store (robot status and last reported heartbeat state).
        server: comms' ``CloudServer`` (``push_control``).
        resend_s: shortest interval between two pushes of the same command to a robot.
    """

    def __init__(self, store: MetadataStore, server: Any, resend_s: float = 1.0) -> None:
        self.store = store
        self.server = server
        self.resend_s = resend_s
        self._pushed: dict[tuple[int, str], float] = {}

    def sync(self) -> list[tuple[str, str]]:
        """Push what disagrees; returns (robot name, command) for each push a stream took."""
        with self.store.session() as s:
            rows = [
                (r.id, r.name, r.status, (r.stats or {}).get("state"))
                for r in s.scalars(select(Robot))
            ]
        now = time.monotonic()
        sent = []
        for robot_id, name, status, reported in rows:
            if status == RobotStatus.ESTOPPED and reported not in (None, "estopped"):
                kind = "estop"
            elif status != RobotStatus.ESTOPPED and reported == "estopped":
                kind = "clear_estop"
            else:
                self._pushed.pop((robot_id, "estop"), None)
                self._pushed.pop((robot_id, "clear_estop"), None)
                continue
            last = self._pushed.get((robot_id, kind))
            if last is not None and now - last < self.resend_s:
                continue
            self._pushed[(robot_id, kind)] = now
            if self.server.push_control(robot_id, kind, reason=f"robot status {status.value}"):
                log.warning("%s pushed to robot %s", kind, name)
                sent.append((name, kind))
        return sent
