"""A run's robots, assigned over their Control streams: the cloud's side of ``edge_agent.host``.

Each leased robot's computer is told to act in the run (``assign`` with the run's
``edge_agent.assignment.Assignment``) and, at the end, to leave it (``release``). Level
triggered, like the pause (:mod:`runs.hold`): one pushed command can be
lost (the robot is not connected at that moment, or its computer restarts and comes back
idle), so each robot's heartbeat (``stats["state"]`` and ``stats["run_id"]``, written by comms'
registry) is compared with what the run wants, and the command is pushed again, at most every
``resend_s``, until they agree. Robot computers own their processes (systemd, a container, the
simulated fleet's supervisor): the cloud never starts or kills an edge agent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from edge_agent.assignment import Assignment
from foundation.store.metadata_store import MetadataStore
from foundation.store.models import Robot

log = logging.getLogger(__name__)

# Heartbeat states of a robot computer that acts in the run its heartbeat names.
ACTING = {"running", "resetting", "paused", "estopped", "stopped"}


@dataclass
class RobotView:
    """What a robot's last heartbeat says: its state, the run it names, its stats."""

    state: str | None
    run_id: str
    stats: dict[str, Any] = field(default_factory=dict)

    def acting_in(self, run_id: str) -> bool:
        return self.run_id == run_id and self.state in ACTING

    def released_from(self, run_id: str) -> bool:
        return self.run_id == run_id and self.state in ("idle", "refused")


def robot_views(store: MetadataStore, names: list[str]) -> dict[str, RobotView]:
    """Robot name -> its last heartbeat (robots without one are missing)."""
    with store.session() as s:
        rows = s.execute(select(Robot.name, Robot.stats).where(Robot.name.in_(names)))
        return {
            name: RobotView(stats.get("state"), str(stats.get("run_id") or ""), dict(stats))
            for name, stats in rows
            if stats
        }


class RobotAssignments:
    """The assignments of one run's robots, by robot name.

    Args:
        store: metadata store (robots' heartbeats).
        server: comms' ``CloudServer`` (``push_control``).
        run_id: the run.
        base: the run's assignment; each robot gets it with its own ``seed``.
        on_event: records an event of the run (``kind, **data``).
        resend_s: shortest interval between two pushes to the same robot.
        route: ``(robot id, name) -> ingest route`` of a sharded run (each push carries a
            fresh one as the assignment's ``ingest``); None: robots upload to the cloud.
    """

    def __init__(
        self,
        store: MetadataStore,
        server: Any,
        run_id: str,
        base: Assignment,
        on_event: Callable[..., None],
        resend_s: float = 3.0,
        route: Callable[[int, str], dict[str, Any] | None] | None = None,
    ) -> None:
        self.store, self.server, self.run_id = store, server, run_id
        self.route = route
        self.base = base
        self.on_event = on_event
        self.resend_s = resend_s
        self.robots: dict[str, tuple[int, Assignment]] = {}  # name -> (robot id, assignment)
        self.reports: dict[str, dict[str, float]] = {}  # name -> final report at release
        self.refused: dict[str, str] = {}  # name -> the robot computer's reason
        self._pushed_at: dict[str, float] = {}
        self._acting: set[str] = set()

    def __len__(self) -> int:
        return len(self.robots)

    @property
    def names(self) -> list[str]:
        return sorted(self.robots)

    @property
    def acting(self) -> list[str]:
        """Robots whose heartbeat says they act in the run (as of the last :meth:`follow`)."""
        return sorted(self._acting)

    def start(
        self,
        name: str,
        robot_id: int,
        index: int,
        demonstrations: Mapping[str, int] | None = None,
    ) -> None:
        """Assign robot ``name`` (the ``index``-th of the run; ``demonstrations``: task ->
        episodes its operator demonstrates first) and push it now."""
        # Meta-World's goal variation is seed % 50 and 100_000 is a multiple of 50: without the
        # 13 * index offset every simulated robot would replay the same variation at the same
        # time (a quarter of the variety per env step with 4 robots, measured in bench
        # efficiency). Real robots ignore the seed.
        seed = 100_000 * (index + 1) + 13 * index
        update = {"seed": seed, "demonstrations": dict(demonstrations or {})}
        self.robots[name] = (robot_id, self.base.model_copy(update=update))
        self._push_assign(name, "leased")
        self.on_event("robot.assigned", robot=name)

    def drop(self, name: str) -> None:
        """Forget a robot the run no longer holds (its lease was released)."""
        self.robots.pop(name, None)
        self._acting.discard(name)

    def follow(self) -> list[str]:
        """Push the assignment again to robots whose heartbeat is not in the run; note the
        robots that joined or left it (events ``robot.joined`` / ``robot.left``).

        Returns:
            The robots acting in the run now.
        """
        views = robot_views(self.store, list(self.robots))
        now_acting = set()
        for name in self.robots:
            view = views.get(name)
            if view is not None and view.acting_in(self.run_id):
                now_acting.add(name)
                continue
            if view is not None and view.state == "refused" and view.run_id == self.run_id:
                why = str(view.stats.get("refused", ""))
                if self.refused.get(name) != why:
                    self.refused[name] = why
                    self.on_event("robot.refused", robot=name, reason=why)
            if time.monotonic() - self._pushed_at.get(name, -1e9) >= self.resend_s:
                state = "no heartbeat" if view is None else f"{view.state} in {view.run_id!r}"
                self._push_assign(name, f"re-sent: heartbeat reports {state}")
        for name in sorted(now_acting - self._acting):
            self.on_event("robot.joined", robot=name)
        for name in sorted(self._acting - now_acting):
            self.on_event("robot.left", robot=name)
        self._acting = now_acting
        return sorted(now_acting)

    def wait_acting(
        self, timeout_s: float, go_on: Callable[[], bool], meanwhile: Callable[[], None]
    ) -> None:
        """Wait until every assigned robot acts in the run (robot connected, policy built,
        uplink and weight subscription up), while ``go_on()``; ``meanwhile()`` between polls.
        Robots still out after ``timeout_s`` are noted (event ``robot.slow_start``) and join
        late."""
        deadline = time.monotonic() + timeout_s
        while go_on() and time.monotonic() < deadline:
            if len(self.follow()) == len(self.robots):
                return
            meanwhile()
            time.sleep(0.25)
        waiting = sorted(set(self.robots) - self._acting)
        if waiting:
            self.on_event("robot.slow_start", robots=waiting, waited_s=timeout_s)

    def release(self, timeout_s: float) -> None:
        """Release every robot: each finishes its episode, drains its spool and reports idle
        (its final report is kept in :attr:`reports`); waits up to ``timeout_s``."""
        waiting = dict(self.robots)
        pushed: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        while waiting:
            views = robot_views(self.store, list(waiting))
            for name, (robot_id, _a) in list(waiting.items()):
                view = views.get(name)
                if view is not None and view.released_from(self.run_id):
                    self.reports[name] = {
                        k: float(v) for k, v in view.stats.items() if isinstance(v, int | float)
                    }
                    del waiting[name]
                elif time.monotonic() - pushed.get(name, -1e9) >= self.resend_s:
                    pushed[name] = time.monotonic()
                    self._push(robot_id, "release", "run ends")
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if waiting:
            self.on_event("robot.release_timeout", robots=sorted(waiting), waited_s=timeout_s)
        self._acting.clear()

    # -- internals ---------------------------------------------------------------------------

    def _push_assign(self, name: str, reason: str) -> None:
        robot_id, assignment = self.robots[name]
        ingest = None if self.route is None else self.route(robot_id, name)
        if ingest is not None:
            assignment = assignment.model_copy(update={"ingest": ingest})
        self._pushed_at[name] = time.monotonic()
        self._push(robot_id, "assign", reason, assignment.to_json())

    def _push(self, robot_id: int, kind: str, reason: str, assignment: str = "") -> bool:
        try:
            return bool(self.server.push_control(robot_id, kind, self.run_id, reason, assignment))
        except Exception as exc:  # the next follow() tries again
            log.warning("pushing %s to robot %d failed: %s", kind, robot_id, exc)
            return False


def split_demonstrations(
    tasks: Sequence[str], per_task: int, robots: int, index: int
) -> dict[str, int]:
    """The demonstrations robot ``index`` of ``robots`` records: of task ``j``'s ``per_task``
    episodes, episode ``k`` goes to robot ``(j + k) % robots``, so the work spreads evenly and
    each robot starts with a different task. Empty for a robot beyond the first ``robots``."""
    out: dict[str, int] = {}
    for j, task in enumerate(tasks):
        n = sum(1 for k in range(per_task) if (j + k) % robots == index)
        if n:
            out[task] = n
    return out
