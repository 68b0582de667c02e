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
    eval/<task>/by/<scorer>   (evaluation episodes scored by each source, :func:`scored_by`)
    autonomous/<task>/episodes, autonomous/<task>/successes
    tally_epoch   (a random number per tally: a new one means the counts start from zero)

so the cloud (``runs.robot_evals``) turns their increments into the
run's success curve without a simulator.
"""

from __future__ import annotations

import secrets
from collections import defaultdict

# Heartbeat statistics travel as float64: an epoch below 2**52 survives the trip exactly.
EPOCH_KEY = "tally_epoch"


def is_evaluation(episode_index: int, every: int) -> bool:
    """Whether episode ``episode_index`` (0-based, of this robot in the run) is an
    evaluation episode; ``every`` 0 means none is."""
    return every > 0 and episode_index % every == every - 1


def scored_by(label: str | None, label_by: str, succeeded: bool, detects_success: bool) -> str:
    """Who decided an evaluation episode's outcome: ``classifier`` (the reward classifier
    proposed its success), ``operator`` (a person's label or abort, at the robot or through
    the cloud), ``driver`` (the robot's own success detection), or ``unscored`` (nobody: no
    label on a robot that does not detect success, counted as a failure).

    Args:
        label / label_by: the episode's label and who gave it (``edge_agent.agent``).
        succeeded: the driver signalled success during the episode.
        detects_success: the robot declares success detection (``Capabilities``).
    """
    if label is not None:
        return "classifier" if label_by == "classifier" else "operator"
    return "driver" if succeeded or detects_success else "unscored"


class SuccessTally:
    """Cumulative outcomes per task of evaluation and autonomous episodes."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = defaultdict(float)
        # A tally that counts from zero (a new robot computer, a lost spool) has a new epoch:
        # it tells the cloud so, even when the new counts are not below the old ones. A run's
        # later agents on the same spool keep it (edge_agent.run_counts).
        self.epoch = float(secrets.randbits(52) + 1)

    def add(
        self,
        kind: str,
        task: str,
        success: bool,
        version: int | None = None,
        scorer: str | None = None,
    ) -> None:
        """Count one finished episode of ``kind`` (``eval`` or ``autonomous``); ``scorer``: who
        decided an evaluation episode's outcome (:func:`scored_by`)."""
        self.counts[f"{kind}/{task}/episodes"] += 1.0
        self.counts[f"{kind}/{task}/successes"] += float(success)
        if kind == "eval" and scorer is not None:
            self.counts[f"eval/{task}/by/{scorer}"] += 1.0
        if kind == "eval" and version is not None:
            self.counts["eval/version"] = float(version)

    def report(self) -> dict[str, float]:
        return {**self.counts, EPOCH_KEY: self.epoch}
