"""Small fixtures shared by the learner tests: synthetic batches and linear policies."""

from __future__ import annotations

import numpy as np
import torch

from cloud_learner.policies import MLPPolicy, PolicySpec


def columns(
    n: int = 400, state_dim: int = 5, action_dim: int = 2, seed: int = 0, num_tasks: int = 1
) -> dict[str, np.ndarray]:
    """Random transitions with every LeRobot key the learner reads."""
    rng = np.random.default_rng(seed)
    return {
        "observation.state": rng.normal(size=(n, state_dim)).astype(np.float32),
        "next.observation.state": rng.normal(size=(n, state_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, action_dim)).astype(np.float32),
        "task_index": rng.integers(0, num_tasks, n).astype(np.int64),
        "is_intervention": rng.random(n) < 0.5,
        "reward": (rng.random(n) < 0.1).astype(np.float32),
        "terminated": rng.random(n) < 0.1,
        "truncated": np.zeros(n, bool),
        "episode_index": np.arange(n, dtype=np.int64) // 50,
        "frame_index": np.arange(n, dtype=np.int64) % 50,
    }


def constant_policy(bias: list[float], state_dim: int = 2, **spec_kw: object) -> MLPPolicy:
    """A depth-0 MLP whose prediction is ``bias`` for every input (weights zeroed)."""
    spec = PolicySpec(state_dim=state_dim, action_dim=len(bias), depth=0, **spec_kw)  # type: ignore[arg-type]
    policy = MLPPolicy(spec)
    with torch.no_grad():
        policy.head[0].weight.zero_()
        policy.head[0].bias.copy_(torch.tensor(bias))
    return policy
