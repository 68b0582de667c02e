"""Where each stored step's reward comes from on the robot: the run's ``reward.source``.

A real arm reports no reward and no success, so the reward a run learns from is chosen by the
run (``foundation.runspec.RewardSpec``) and computed here, on the robot, at the step it
belongs to:

* :class:`RobotReward` (``robot``): the driver's own reward (``EpisodeView.reward``);
* :class:`LabelReward` (``labels``): HIL-SERL's sparse terminal reward: 1.0 on the step at
  which the operator's ``success`` verdict ended the episode, 0.0 on every other step (a
  ``failure`` verdict, a truncation and every step before a verdict are 0.0);
* the reward classifier (``classifier``, ``edge_agent.reward_classifier``), shipped beside
  the policy, which scores each step and may propose success.

A source returns a :class:`Scored` per step; ``proposed_success`` asks the agent to end the
episode as a success (the classifier's proposal, which the operator can overrule).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from edge_agent.core import EpisodeView, Observation

REWARD_SOURCES = ("robot", "labels", "classifier")


@dataclass(frozen=True)
class Scored:
    """One step's reward (float, stored as the row's ``reward``) and whether the source
    proposes that the episode succeeded at this step."""

    reward: float
    proposed_success: bool = False


class RewardSource(Protocol):
    """Scores each step of an episode (see the module docstring)."""

    name: str

    def reset(self) -> None:
        """A new episode starts."""

    def score(self, next_obs: Observation, view: EpisodeView, verdict: str | None) -> Scored:
        """The reward of the step just sent.

        Args:
            next_obs: the observation after the step (the state the step reached).
            view: the driver's episode view after the step.
            verdict: the operator's ``success`` / ``failure`` verdict given at this step,
                None for none.
        """
        ...

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        """A new weight version was applied (a classifier takes its tensors from it)."""


class RobotReward:
    """The driver's reward, as the robot reports it."""

    name = "robot"

    def reset(self) -> None:
        pass

    def score(self, next_obs: Observation, view: EpisodeView, verdict: str | None) -> Scored:
        return Scored(float(view.reward))

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        pass


class LabelReward:
    """1.0 exactly on the step of an operator's ``success`` verdict, else 0.0."""

    name = "labels"

    def reset(self) -> None:
        pass

    def score(self, next_obs: Observation, view: EpisodeView, verdict: str | None) -> Scored:
        return Scored(1.0 if verdict == "success" else 0.0)

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        pass


def make_reward_source(source: str) -> RewardSource:
    """The reward source of a run's ``reward.source``.

    Raises:
        ValueError: an unknown source (the known ones named).
    """
    if source == "robot":
        return RobotReward()
    if source == "labels":
        return LabelReward()
    if source == "classifier":
        from edge_agent.reward_classifier import ClassifierReward

        return ClassifierReward()
    raise ValueError(f"unknown reward source {source!r}; known: {list(REWARD_SOURCES)}")
