"""``reward.source: classifier`` on the robot: the run's reward classifier, shipped beside the
policy in each weight version, scores every step.

Until the first classifier version reaches the robot the operator's verdicts give the reward
(:class:`~edge_agent.rewards.LabelReward`'s rule): the run starts from labels, as HIL-SERL's
classifier is trained from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_agent.core import EpisodeView, Observation
from edge_agent.rewards import LabelReward, Scored


class ClassifierReward:
    """The classifier's reward once a version carries one; the operator's labels before."""

    name = "classifier"

    def __init__(self) -> None:
        self._labels = LabelReward()

    def reset(self) -> None:
        self._labels.reset()

    def score(self, next_obs: Observation, view: EpisodeView, verdict: str | None) -> Scored:
        return self._labels.score(next_obs, view, verdict)

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        pass
