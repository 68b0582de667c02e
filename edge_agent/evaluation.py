"""Success measured on the robot itself: policy-only evaluation episodes and autonomous ones.

With ``edge.evaluate_every_episodes: N`` (a run's setting, sent with its assignment) every Nth
episode of a robot is an **evaluation episode**: the policy alone acts, the operator's
takeovers are not executed, and an operator's episode command (failure, rerecord, e-stop)
ends it as a failure; success is the operator's ``success`` label or the driver's success
signal (``driver.episode.success``). Its steps are recorded like any other (they are real
data, ``is_intervention`` False). Every other episode is a training episode; one in which the
operator never intervened is **autonomous**, and its outcome is counted too.

The counts travel in the heartbeat statistics (cumulative, per task)::

    eval/<task>/episodes, eval/<task>/successes, eval/version   (last evaluated version)
    autonomous/<task>/episodes, autonomous/<task>/successes

so the cloud (``runs.robot_evals``) turns their increments into the
run's success curve without a simulator.
"""

from __future__ import annotations

from collections import defaultdict


def is_evaluation(episode_index: int, every: int) -> bool:
    """Whether episode ``episode_index`` (0-based, of this robot in the run) is an
    evaluation episode; ``every`` 0 means none is."""
    return every > 0 and episode_index % every == every - 1


class SuccessTally:
    """Cumulative outcomes per task of evaluation and autonomous episodes."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = defaultdict(float)

    def add(self, kind: str, task: str, success: bool, version: int | None = None) -> None:
        """Count one finished episode of ``kind`` (``eval`` or ``autonomous``)."""
        self.counts[f"{kind}/{task}/episodes"] += 1.0
        self.counts[f"{kind}/{task}/successes"] += float(success)
        if kind == "eval" and version is not None:
            self.counts["eval/version"] = float(version)

    def report(self) -> dict[str, float]:
        return dict(self.counts)
