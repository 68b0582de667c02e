"""``reward.source: classifier`` on the robot: the run's reward classifier, shipped beside the
policy in each weight version (``cloud_learner.reward_classifier``), scores every step.

Per step, on the observation the step reached: P(success) >= the classifier card's threshold
gives reward 1.0 and proposes success (the agent ends the episode there, labelled by
``classifier``, unless the operator overrules: ``EdgeAgent._proposed_success``); below it, 0.0.
An operator's verdict at that step wins over the classifier: ``success`` 1.0, ``failure`` 0.0,
and no proposal.

Until the first classifier version reaches the robot the operator's verdicts give the reward
(:class:`~edge_agent.rewards.LabelReward`'s rule): the run starts from labels, as HIL-SERL's
classifier is trained from them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from cloud_learner.reward_classifier import RewardClassifier, RewardClassifierError, read_card
from edge_agent.core import EpisodeView, Observation
from edge_agent.rewards import LabelReward, Scored

log = logging.getLogger(__name__)


class ClassifierReward:
    """The classifier's reward once a version carries one; the operator's labels before.

    Attributes:
        classifier: the running classifier (None until a version carries one).
        last_probability: P(success) of the last scored step (None: not scored by a
            classifier).
    """

    name = "classifier"

    def __init__(self) -> None:
        self._labels = LabelReward()
        self.classifier: RewardClassifier | None = None
        self.last_probability: float | None = None

    @property
    def version(self) -> int:
        """The running classifier's version (0: none yet)."""
        return self.classifier.version if self.classifier is not None else 0

    def reset(self) -> None:
        self._labels.reset()
        self.last_probability = None

    def score(self, next_obs: Observation, view: EpisodeView, verdict: str | None) -> Scored:
        model = self.classifier
        if verdict is not None or model is None:
            self.last_probability = None
            return self._labels.score(next_obs, view, verdict)
        frames = {k: np.asarray(next_obs[k])[None] for k in model.keys}
        p = float(model.success_probability(frames)[0])
        self.last_probability = p
        if p >= model.threshold:
            return Scored(1.0, proposed_success=True)
        return Scored(0.0)

    def offer_weights(self, weights: Mapping[str, Any]) -> None:
        """Build the version's classifier when it carries one of another version; a version
        without one keeps the running classifier; an unreadable one is logged and skipped."""
        try:
            card = read_card(weights)
            if card is None or int(card.get("version", -1)) == self.version:
                return
            self.classifier = RewardClassifier.from_tensors(weights)
        except (RewardClassifierError, ValueError) as exc:
            log.error("keeping reward classifier version %d: %s", self.version, exc)
            return
        log.info("reward classifier version %d applied", self.classifier.version)
