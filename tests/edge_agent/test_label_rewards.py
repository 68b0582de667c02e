"""``reward.source: labels`` on a blind Meta-World robot: the simulated person's verdict is
the reward, 1.0 exactly on the verdict step of a success episode."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.gating import HGDaggerGate
from edge_agent.operators import ScriptedOperator
from edge_agent.rewards import LabelReward, RobotReward, make_reward_source
from edge_agent.simulated_person import SimulatedPerson
from hal.drivers.metaworld import MetaWorldDriver, expert_policy
from tests.edge_agent.helpers import BiasPolicy, make_agent, spooled_rows
from tests.fakes.settings import fast_edge

STEPS = 120


def _blind_agent(tmp_path, labelled: int | None):
    driver = MetaWorldDriver(
        "blind-1",
        tasks=["reach-v3"],
        max_episode_steps=STEPS,
        reward="none",
        detects_success=False,
    )
    hands = ScriptedOperator(
        expert_policy("reach-v3"),
        HGDaggerGate(threshold=0.3, handback_steps=5),
        bounds=(np.full(4, -1, np.float32), np.ones(4, np.float32)),
    )
    person = SimulatedPerson.watching(driver, hands, STEPS, labelled_episodes=labelled)
    settings = fast_edge(control_hz=1000.0)
    agent = make_agent(
        tmp_path, driver, BiasPolicy(), operator=person, settings=settings, rewards=LabelReward()
    )
    return agent, person


def test_the_verdict_step_of_a_success_episode_carries_the_only_reward(tmp_path):
    agent, person = _blind_agent(tmp_path, labelled=1)
    agent.run(episodes=2)
    rows = spooled_rows(agent.uplink.spool)
    episode = np.asarray(rows.column("episode_index").to_pylist())
    reward = np.asarray(rows.column("reward").to_pylist())
    terminated = np.asarray(rows.column("terminated").to_pylist())
    first = episode == 0
    # the person saw the expert reach the goal and said so: that step ends the episode
    assert terminated[first][-1] and first.sum() < STEPS
    assert reward[first].tolist() == [0.0] * (first.sum() - 1) + [1.0]
    # the second episode is not labelled (the person labels one): no reward anywhere in it
    assert (episode == 1).sum() == STEPS and not reward[episode == 1].any()
    marks = [(m.episode_index, m.kind, m.reason) for m in agent.marks.pending()]
    assert marks[0] == (0, "success", "SimulatedPerson")
    assert person.labels == 1 and agent.stats.labels["success"] == 1


def test_a_failure_verdict_gives_no_reward():
    r = LabelReward()
    assert r.score({}, None, "failure").reward == 0.0  # type: ignore[arg-type]
    assert r.score({}, None, None).reward == 0.0  # type: ignore[arg-type]
    assert r.score({}, None, "success").reward == 1.0  # type: ignore[arg-type]


def test_reward_sources_by_name():
    assert isinstance(make_reward_source("robot"), RobotReward)
    assert isinstance(make_reward_source("labels"), LabelReward)
    with pytest.raises(ValueError, match="sky.*labels"):
        make_reward_source("sky")


def test_the_person_reviews_a_proposal_against_what_the_scene_shows():
    seen = {"success": False}
    hands = ScriptedOperator(lambda obs: np.zeros(4, np.float32), HGDaggerGate(0.3, 5))
    person = SimulatedPerson(hands, lambda: seen["success"], episode_steps=None)
    assert person.review("success") == "failure" and person.labels == 1
    seen["success"] = True
    assert person.review("success") is None and person.labels == 1
