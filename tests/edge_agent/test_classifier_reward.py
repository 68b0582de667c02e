"""``reward.source: classifier`` on a blind Meta-World robot: the classifier shipped in a weight
version ends an episode on predicted success (reward 1, labelled ``classifier``), and a simulated
person's overrule turns that ending into the person's failure (reward 0, a label)."""

from __future__ import annotations

import numpy as np
import torch

from cloud_learner.reward_classifier import RewardClassifier
from edge_agent.gating import HGDaggerGate
from edge_agent.operators import ScriptedOperator
from edge_agent.reward_classifier import ClassifierReward
from edge_agent.rewards import make_reward_source
from edge_agent.simulated_person import SimulatedPerson
from edge_agent.weights import StagedWeights
from hal.drivers.metaworld import MetaWorldDriver, expert_policy
from tests.edge_agent.helpers import BiasPolicy, make_agent, spooled_rows
from tests.fakes.settings import fast_edge

STEPS = 40


def _always(features, p_logit: float, version: int = 1) -> RewardClassifier:
    """A classifier whose P(success) is sigmoid(p_logit) on every observation."""
    model = RewardClassifier(features, version=version)
    with torch.no_grad():
        last = model.net.head[-1]
        last.weight.zero_()
        last.bias.fill_(p_logit)
    return model


def _blind(tmp_path, person: bool, p_logit: float = 8.0):
    driver = MetaWorldDriver(
        "blind-1", tasks=["reach-v3"], max_episode_steps=STEPS, reward="none", detects_success=False
    )
    operator = None
    if person:
        hands = ScriptedOperator(
            expert_policy("reach-v3"),
            HGDaggerGate(threshold=10.0, handback_steps=5),  # never takes over
            bounds=(np.full(4, -1, np.float32), np.ones(4, np.float32)),
        )
        operator = SimulatedPerson.watching(driver, hands, STEPS, labelled_episodes=0)
    staged = StagedWeights()
    policy = BiasPolicy()
    classifier = _always(driver.observation_features, p_logit)
    staged.offer(1, {**policy.get_weights(), **classifier.to_tensors()})
    rewards = make_reward_source("classifier")
    agent = make_agent(
        tmp_path,
        driver,
        policy,
        operator=operator,
        settings=fast_edge(control_hz=1000.0),
        weights=staged,
        rewards=rewards,
    )
    return agent, rewards


def test_predicted_success_ends_the_episode_labelled_by_the_classifier(tmp_path) -> None:
    agent, rewards = _blind(tmp_path, person=False)
    agent.run(episodes=1)
    assert isinstance(rewards, ClassifierReward) and rewards.version == 1
    rows = spooled_rows(agent.uplink.spool)
    # the version's classifier reached the reward source and proposed success at once
    assert rows.column("reward").to_pylist() == [1.0]
    assert rows.column("terminated").to_pylist() == [True]
    marks = [(m.episode_index, m.kind, m.reason) for m in agent.marks.pending()]
    assert marks == [(0, "success", "classifier")]
    report = agent.report()
    assert (report["reward_proposals"], report["reward_overrules"]) == (1.0, 0.0)


def test_a_persons_overrule_makes_the_ending_a_failure_label(tmp_path) -> None:
    agent, _ = _blind(tmp_path, person=True)
    agent.run(episodes=2)
    rows = spooled_rows(agent.uplink.spool)
    # the reach is not solved at the first step: the person says so, the episode ends there,
    # truncated: the overruled state is no terminal of the task, a critic bootstraps from it
    assert rows.column("reward").to_pylist() == [0.0, 0.0]
    assert rows.column("terminated").to_pylist() == [False, False]
    assert rows.column("truncated").to_pylist() == [True, True]
    marks = [(m.episode_index, m.kind, m.reason) for m in agent.marks.pending()]
    assert marks == [(0, "failure", "SimulatedPerson"), (1, "failure", "SimulatedPerson")]
    assert agent.stats.labels["failure"] == 2
    report = agent.report()
    assert (report["reward_proposals"], report["reward_overrules"]) == (2.0, 2.0)


def test_below_threshold_no_reward_and_the_operators_verdict_wins(tmp_path) -> None:
    agent, rewards = _blind(tmp_path, person=False, p_logit=-8.0)
    agent.run(episodes=1)
    rows = spooled_rows(agent.uplink.spool)
    assert len(rows) == STEPS and not any(rows.column("reward").to_pylist())
    assert rewards.last_probability is not None and rewards.last_probability < 0.01
    # an operator's verdict at a step: its reward, no proposal
    assert rewards.score({}, None, "success").reward == 1.0  # type: ignore[arg-type]
    assert not rewards.score({}, None, "failure").proposed_success  # type: ignore[arg-type]


def test_a_version_without_a_classifier_keeps_the_running_one() -> None:
    features = {"observation.state": {"dtype": "float32", "shape": (3,)}}
    source = ClassifierReward()
    source.offer_weights({"bias": torch.zeros(4)})
    assert source.classifier is None
    source.offer_weights(_always(features, 1.0, version=2).to_tensors())
    source.offer_weights({"bias": torch.zeros(4)})
    assert source.version == 2
    source.offer_weights({"reward_classifier._card": torch.tensor([1], dtype=torch.uint8)})
    assert source.version == 2  # unreadable: logged, the running classifier stays
