"""A run's human cost per robot and per task, from its robots' heartbeat statistics.

Each robot counts, per task (``edge_agent.human_cost``; cumulative over the run)::

    human/<task>/takeover_s, labels, reset_s, resets, episode_s, autonomous_reset_s
    autonomous/<task>/episodes, autonomous/<task>/successes     (edge_agent.evaluation)

From them, per robot and task, summed over the robots per task, and over everything:

* ``successes_per_hour_excl_resets`` = autonomous successes / hours of autonomous episodes
  (the robot's working time only, as SOP reports throughput);
* ``successes_per_hour_incl_resets`` = autonomous successes / (hours of autonomous episodes +
  hours of the resets that followed them): what a robot and the person resetting it deliver.

Both are None without autonomous episode time. On robots that reset themselves the two are
equal (no reset time). A robot computer that restarts during the run takes its counts up where
its last agent saved them, at the end of its last episode (``edge_agent.run_counts``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class TaskCost:
    """One robot's (or a sum of robots') human cost on one task; seconds, counts."""

    takeover_s: float = 0.0
    labels: float = 0.0
    reset_s: float = 0.0
    resets: float = 0.0
    episode_s: float = 0.0
    autonomous_reset_s: float = 0.0
    autonomous_episodes: float = 0.0
    autonomous_successes: float = 0.0

    def add(self, other: TaskCost) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def rates(self) -> dict[str, float | None]:
        """Autonomous successes per hour, excluding and including resets (None: no time)."""
        with_resets = self.episode_s + self.autonomous_reset_s
        return {
            "successes_per_hour_excl_resets": (
                3600.0 * self.autonomous_successes / self.episode_s if self.episode_s else None
            ),
            "successes_per_hour_incl_resets": (
                3600.0 * self.autonomous_successes / with_resets if with_resets else None
            ),
        }

    def to_dict(self) -> dict[str, float | None]:
        return {**asdict(self), **self.rates()}


_HUMAN = ("takeover_s", "labels", "reset_s", "resets", "episode_s", "autonomous_reset_s")
_AUTONOMOUS = {"episodes": "autonomous_episodes", "successes": "autonomous_successes"}


def robot_costs(stats: Mapping[str, Any]) -> dict[str, TaskCost]:
    """Task -> cost, from one robot's heartbeat statistics (other keys are ignored)."""
    out: dict[str, TaskCost] = {}
    for key, value in stats.items():
        parts = key.split("/")
        if len(parts) != 3 or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        kind, task, name = parts
        if kind == "human" and name in _HUMAN:
            attr = name
        elif kind == "autonomous" and name in _AUTONOMOUS:
            attr = _AUTONOMOUS[name]
        else:
            continue
        cost = out.setdefault(task, TaskCost())
        setattr(cost, attr, getattr(cost, attr) + float(value))
    return out


def human_cost(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The run's human cost from each robot's statistics (robot name -> heartbeat stats).

    Returns:
        ``{"robots": {robot: {task: figures}}, "tasks": {task: figures}, "total": figures}``,
        figures being :class:`TaskCost`'s fields plus the two rates (module doc).
    """
    robots: dict[str, dict[str, Any]] = {}
    tasks: dict[str, TaskCost] = {}
    total = TaskCost()
    for robot, stats in sorted(reports.items()):
        costs = robot_costs(stats)
        if not costs:
            continue
        robots[robot] = {t: c.to_dict() for t, c in sorted(costs.items())}
        for task, cost in costs.items():
            tasks.setdefault(task, TaskCost()).add(cost)
            total.add(cost)
    return {
        "robots": robots,
        "tasks": {t: c.to_dict() for t, c in sorted(tasks.items())},
        "total": total.to_dict(),
    }


_COLUMNS = (
    ("takeover_s", "takeover s", "{:.1f}"),
    ("labels", "labels", "{:.0f}"),
    ("resets", "resets", "{:.0f}"),
    ("reset_s", "reset s", "{:.1f}"),
    ("episode_s", "auto s", "{:.1f}"),
    ("autonomous_successes", "auto ok", "{:.0f}"),
    ("successes_per_hour_excl_resets", "ok/h excl", "{:.1f}"),
    ("successes_per_hour_incl_resets", "ok/h incl", "{:.1f}"),
)


def text_table(cost: Mapping[str, Any]) -> str:
    """:func:`human_cost`'s figures as a plain-text table: a row per robot and task, per task
    over all robots, and the total."""
    rows: list[tuple[str, str, Mapping[str, Any]]] = []
    for robot, per_task in cost["robots"].items():
        rows += [(robot, task, figures) for task, figures in per_task.items()]
    rows += [("all robots", task, figures) for task, figures in cost["tasks"].items()]
    rows.append(("all robots", "all tasks", cost["total"]))
    header = ["robot", "task", *(title for _k, title, _f in _COLUMNS)]
    table = [header] + [
        [robot, task, *(_cell(figures.get(k), fmt) for k, _t, fmt in _COLUMNS)]
        for robot, task, figures in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
