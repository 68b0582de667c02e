"""What a robot's people spent, per task: takeovers, labels, resets; and autonomous time.

Counted by the control loop and reported, cumulative over the run (a restarted or re-assigned
robot's agent takes them up where the last one saved them: ``edge_agent.run_counts``), in the
heartbeat statistics (flat keys, ``<task>`` the task of the episode concerned)::

    human/<task>/takeover_s          seconds of steps the operator claimed (is_intervention;
                                     demonstrations included): steps x control period
    human/<task>/labels              operator verdicts given (success / failure; the cloud's
                                     and a reward classifier's are not a person's)
    human/<task>/reset_s             seconds the robot held for a person's reset after an
                                     episode of the task (edge_agent.resets), as they pass
    human/<task>/resets              resets completed (ready given)
    human/<task>/episode_s           seconds of autonomous episodes (training episodes with no
                                     takeover, as SuccessTally's autonomous/<task>/...):
                                     steps x control period
    human/<task>/autonomous_reset_s  the part of reset_s that followed autonomous episodes

Steps count at the control period (1 / control rate): the robot's working time, not the wall
time of a loop that overran. The cloud turns these, with ``autonomous/<task>/successes``, into
autonomous successes per hour with and without resets (``runs.human_cost``).
"""

from __future__ import annotations

from collections import defaultdict

KEYS = ("takeover_s", "labels", "reset_s", "resets", "episode_s", "autonomous_reset_s")


class HumanCost:
    """Cumulative per-task counters of one robot (see the module doc).

    Args:
        period: seconds per control step (1 / control rate).
    """

    def __init__(self, period: float) -> None:
        self.period = period
        self.counts: dict[str, float] = defaultdict(float)
        self._last: tuple[str, bool] | None = None  # (task, autonomous) of the last episode

    def step(self, task: str, intervening: bool) -> None:
        """One executed step of ``task``; ``intervening``: the operator claimed it."""
        if intervening:
            self.counts[f"human/{task}/takeover_s"] += self.period

    def label(self, task: str) -> None:
        """The operator gave a success / failure verdict on an episode of ``task``."""
        self.counts[f"human/{task}/labels"] += 1.0

    def episode(self, task: str, steps: int, autonomous: bool) -> None:
        """An episode of ``task`` ended after ``steps`` steps; resets that follow are its."""
        if autonomous:
            self.counts[f"human/{task}/episode_s"] += steps * self.period
        self._last = (task, autonomous)

    def reset_time(self, seconds: float) -> None:
        """``seconds`` more of holding for a reset after the last episode."""
        if self._last is None or seconds <= 0:
            return
        task, autonomous = self._last
        self.counts[f"human/{task}/reset_s"] += seconds
        if autonomous:
            self.counts[f"human/{task}/autonomous_reset_s"] += seconds

    def reset_done(self) -> None:
        """The person signalled ready: one reset after the last episode completed."""
        if self._last is not None:
            self.counts[f"human/{self._last[0]}/resets"] += 1.0

    def report(self) -> dict[str, float]:
        return dict(self.counts)
