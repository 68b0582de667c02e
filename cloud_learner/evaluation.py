"""Evaluation episodes on simulated robots (Meta-World), success rate per task.

Uses Meta-World's Gymnasium API directly (``gymnasium.make("Meta-World/MT1", ...)``); the
operator never acts here. Episodes are seeded, so a held-out seed range gives a fixed test set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cloud_learner.core import Policy


def make_metaworld_env(env_name: str, seed: int, max_episode_steps: int) -> Any:
    """One Meta-World MT1 environment (random goal per reset, set by the reset seed)."""
    import gymnasium as gym
    import metaworld  # noqa: F401  (registers the Meta-World/* environments)

    return gym.make(
        "Meta-World/MT1", env_name=env_name, seed=seed, max_episode_steps=max_episode_steps
    )


def scripted_expert(env_name: str) -> Any:
    """Meta-World's scripted policy for ``env_name`` (e.g. reach-v3 -> SawyerReachV3Policy)."""
    from metaworld import policies

    name = "Sawyer" + "".join(p.capitalize() for p in env_name.split("-")[:-1])
    name += env_name.split("-")[-1].upper() + "Policy"
    return getattr(policies, name)()


@dataclass
class EvalResult:
    """Success rate (0..1) and mean episode length of one task."""

    task: str
    success_rate: float
    mean_length: float
    episodes: int


def evaluate_metaworld(
    policy: Policy,
    env_names: Sequence[str],
    seeds: Sequence[int],
    max_episode_steps: int = 150,
    state_indices: Sequence[int] | None = None,
) -> list[EvalResult]:
    """Run ``len(seeds)`` episodes per task with the policy alone; task index = position.

    ``state_indices`` selects what the robot observes from Meta-World's 39-d vector (all when
    None); an episode succeeds when ``info["success"]`` is reached within the step limit.
    """
    results = []
    for task_index, env_name in enumerate(env_names):
        env = make_metaworld_env(env_name, seed=int(seeds[0]), max_episode_steps=max_episode_steps)
        successes, lengths = 0, []
        try:
            for seed in seeds:
                obs, _ = env.reset(seed=int(seed))
                steps = 0
                while steps < max_episode_steps:
                    steps += 1
                    state = obs if state_indices is None else obs[list(state_indices)]
                    action = policy.act({"observation.state": state.astype(np.float32)}, task_index)
                    obs, _r, terminated, truncated, info = env.step(np.clip(action, -1, 1))
                    if info.get("success", 0.0) >= 1.0:
                        successes += 1
                        break
                    if terminated or truncated:
                        break
                lengths.append(steps)
        finally:
            env.close()
        results.append(
            EvalResult(env_name, successes / len(seeds), float(np.mean(lengths)), len(seeds))
        )
    return results
