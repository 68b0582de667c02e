"""A Meta-World robot that gives robofleet what a real arm gives: no reward, no success, no
self-reset, with the simulator's verdict kept aside for measurement."""

from __future__ import annotations

import json

import pytest

from hal.drivers.metaworld import MetaWorldDriver, expert_policy


def _run_expert(d: MetaWorldDriver, steps: int = 150) -> tuple[list[float], list[bool]]:
    act = expert_policy("reach-v3")
    obs = d.reset(task="reach-v3", seed=3)
    rewards, truth = [], []
    for _ in range(steps):
        if d.episode.done:
            break
        d.send_action({"action": act(obs)})
        obs = d.get_observation()
        rewards.append(d.episode.reward)
        assert d.ground_truth is not None
        truth.append(d.ground_truth.success)
    return rewards, truth


def test_blind_robot_hides_reward_and_success_and_keeps_the_truth_aside(tmp_path) -> None:
    log = tmp_path / "truth.jsonl"
    d = MetaWorldDriver(
        "blind-0",
        tasks=["reach-v3"],
        reward="none",
        detects_success=False,
        self_reset=False,
        terminate_on_success=True,
        ground_truth_log=log,
    )
    caps = d.spec.capabilities
    assert (caps.reward, caps.detects_success, caps.can_reset) == ("none", False, False)
    d.connect()
    try:
        rewards, truth = _run_expert(d)
        assert any(truth), "the expert reaches the goal in the simulator"
        # robofleet sees nothing of it: no reward, no success, no early termination
        assert set(rewards) == {0.0}
        assert not d.episode.success and not d.episode.terminated
        gt = d.ground_truth
        assert gt is not None and gt.first_success_frame == truth.index(True)
        d.reset(task="reach-v3", seed=4)  # the ended episode's verdict goes to the log
    finally:
        d.disconnect()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0]["robot"] == "blind-0" and lines[0]["seed"] == 3
    assert lines[0]["first_success_frame"] == truth.index(True)
    assert lines[0]["frame"] == len(truth)


def test_sparse_reward_is_one_exactly_on_the_solved_steps() -> None:
    d = MetaWorldDriver("sparse-0", tasks=["reach-v3"], reward="sparse")
    assert d.spec.capabilities.reward == "sparse"
    d.connect()
    try:
        rewards, truth = _run_expert(d, steps=120)
    finally:
        d.disconnect()
    assert any(truth)
    assert rewards == [1.0 if t else 0.0 for t in truth]
    assert d.spec.capabilities.detects_success


def test_bad_reward_option_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="reward.*shaped"):
        MetaWorldDriver("x-0", reward="shaped")  # type: ignore[arg-type]
