"""The run's ``reward.source`` on a gateway robot: which reward its stored steps carry.

LeRobot's actor sends the reward its environment (or LeRobot's own reward classifier) gave.

* ``robot``: that reward is stored as sent.
* ``classifier``: the run's reward classifier (``edge_agent.reward_classifier``, shipped
  beside the policy in each version) replaces it: 1.0 where P(success) of the observation the
  step reached (LeRobot's ``next_state``) is at or above the classifier's threshold, else 0.0;
  0.0 until the first classifier version arrives (the labels' rule with no verdict: none reach
  a gateway). The classifier's proposal to end the episode cannot reach LeRobot's actor (its
  protocol has no such message): LeRobot's ``done`` still ends the episode.
* ``labels``: refused at assignment (:class:`RewardSourceRefused`): its reward is the
  operator's success / failure verdict, and LeRobot's actor sends none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.rewards import REWARD_SOURCES, RewardSource, make_reward_source

GATEWAY_SOURCES = ("robot", "classifier")


class RewardSourceRefused(ValueError):
    """A run's ``reward.source`` a gateway robot cannot apply (the message names it)."""


@dataclass
class _Sent:
    """LeRobot's step outcome as the reward sources' episode view."""

    reward: float
    terminated: bool
    truncated: bool
    success: bool = False


class GatewayReward:
    """The reward a gateway stores for each LeRobot transition (see the module).

    Args:
        source: the run's ``reward.source``.

    Raises:
        RewardSourceRefused: ``labels``, or a source not in ``edge_agent.rewards``.
    """

    def __init__(self, source: str) -> None:
        if source == "labels":
            raise RewardSourceRefused(
                "reward.source 'labels' needs the operator's success / failure verdicts, "
                "which LeRobot's actor does not send; a gateway robot takes "
                f"{list(GATEWAY_SOURCES)}"
            )
        if source not in REWARD_SOURCES:
            raise RewardSourceRefused(
                f"reward.source {source!r} is unknown; a gateway robot takes "
                f"{list(GATEWAY_SOURCES)}"
            )
        self.name = source
        self._source: RewardSource = make_reward_source(source)

    @property
    def replaces(self) -> bool:
        """Whether the stored reward is the run's, not the one LeRobot's actor sent."""
        return self.name != "robot"

    @property
    def needs_next_observation(self) -> bool:
        return self.replaces

    def reward(
        self,
        sent: float,
        next_obs: Mapping[str, np.ndarray] | None,
        terminated: bool,
        truncated: bool,
    ) -> float:
        """The reward to store: ``sent`` (LeRobot's) for ``robot``, else the run's source's
        on ``next_obs`` (robofleet's observation arrays of the step's ``next_state``)."""
        if not self.replaces:
            return sent
        view = _Sent(sent, terminated, truncated)
        return self._source.score(dict(next_obs or {}), view, None).reward

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        """A run version arrived (the classifier takes its tensors from it)."""
        self._source.offer_weights(weights)
