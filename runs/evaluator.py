"""Evaluation episodes: the policy alone (the operator never acts), fixed seeds per task.

An episode succeeds when Meta-World reports success within ``max_steps``; an episode an
operator rescued cannot count, because no operator is attached. Seeds ``10_000 + i`` (goal
variation ``seed % 50`` of hal's Meta-World driver) are the fixed evaluation configurations;
training robot i starts its seeds at 100_000 * (i + 1) + 13 * i (so robots cover different
variations at the same time), demonstrations at 20_000.

The evaluated policy is built exactly as on a robot (``edge_agent.policy_build.CardPolicy``,
from the version's policy card) but acts deterministically: SAC's Gaussian with its mean
``tanh(mu)``, RECAP conditioned on "positive", HG-DAgger's MLP as it is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

EVAL_SEED = 10_000


def build_policy(dims: tuple[int, int], num_tasks: int, hidden: int) -> Any:
    """The edge agents' policy (``edge_agent.build``) in evaluation mode: built from each
    version's policy card, an MLP on state + task one-hot ``hidden`` wide without one.
    ``dims``: the run's (state, action) sizes."""
    from edge_agent.policy_build import CardPolicy

    return CardPolicy(dims[0], dims[1], num_tasks, hidden, stochastic=False)


def evaluate(policy: Any, tasks: Sequence[str], episodes: int, max_steps: int) -> dict[str, float]:
    """Success rate (0..1) per task over ``episodes`` seeded episodes each, on a simulated
    Meta-World robot (``cloud_learner.evaluation.evaluate``)."""
    from cloud_learner.evaluation import evaluate as evaluate_on
    from hal.drivers.metaworld import MetaWorldDriver

    driver = MetaWorldDriver("eval", tasks=list(tasks), max_episode_steps=max_steps)
    driver.connect()
    try:
        seeds = [EVAL_SEED + i for i in range(episodes)]
        return evaluate_on(policy, driver, tasks, seeds, max_steps)
    finally:
        driver.disconnect()


class Evaluator:
    """Plain class behind the evaluation Ray actor (one per run, its own process)."""

    def __init__(
        self,
        tasks: Sequence[str],
        dims: tuple[int, int],
        hidden: int,
        episodes: int,
        max_steps: int,
        nice: int = 0,
    ) -> None:
        import torch

        torch.set_num_threads(1)
        if nice:
            os.nice(nice)  # the measuring instrument yields the CPU to what it measures
        self.tasks = list(tasks)
        self.policy = build_policy(dims, len(self.tasks), hidden)
        self.episodes = episodes
        self.max_steps = max_steps

    def evaluate(self, weights: bytes) -> dict[str, float]:
        """``weights``: a safetensors file's bytes (what the learner published)."""
        from safetensors.torch import load

        self.policy.set_weights(load(weights))
        return evaluate(self.policy, self.tasks, self.episodes, self.max_steps)


def remote_evaluator(**actor_options: Any) -> Any:
    import ray

    return ray.remote(**{"num_cpus": 0, **actor_options})(Evaluator)
