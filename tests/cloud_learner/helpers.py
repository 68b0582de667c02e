"""Small fixtures shared by the learner tests: synthetic batches, buffer step records and
linear policies."""

from __future__ import annotations

from typing import Any

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


# Features of ``rows``' buffer (Meta-World Sawyer sizes).
STATE, ACTION = {"dtype": "float32", "shape": (39,)}, {"dtype": "float32", "shape": (4,)}


def rows(
    n: int,
    robot_id: str = "robot-1",
    first_seq: int = 0,
    episode_steps: int = 50,
    task: str = "reach-v3",
) -> list[dict[str, Any]]:
    """``n`` buffer step records (``STATE`` / ``ACTION`` features; seq from ``first_seq``)
    of ``episode_steps``-step episodes of ``robot_id`` on ``task``, every other step the
    operator's; the last step of each episode is its truncation, with its final
    observation."""
    rng = np.random.default_rng(first_seq)
    out = []
    for seq in range(first_seq, first_seq + n):
        frame = (seq - first_seq) % episode_steps
        last = frame == episode_steps - 1
        row: dict[str, Any] = {
            "seq": seq,
            "robot_id": robot_id,
            "run_id": "run-1",
            "task": task,
            "episode_index": seq // episode_steps,
            "frame_index": frame,
            "timestamp": frame / 20,
            "reward": 0.0,
            "terminated": False,
            "truncated": last,
            "is_intervention": seq % 2 == 0,
            "policy_version": 1,
            "action": rng.uniform(-1, 1, 4).astype(np.float32),
            "observation.state": rng.normal(size=39).astype(np.float32),
        }
        if last:
            row["next.observation.state"] = rng.normal(size=39).astype(np.float32)
        out.append(row)
    return out


def constant_policy(bias: list[float], state_dim: int = 2, **spec_kw: object) -> MLPPolicy:
    """A depth-0 MLP whose prediction is ``bias`` for every input (weights zeroed)."""
    spec = PolicySpec(state_dim=state_dim, action_dim=len(bias), depth=0, **spec_kw)  # type: ignore[arg-type]
    policy = MLPPolicy(spec)
    with torch.no_grad():
        policy.head[0].weight.zero_()
        policy.head[0].bias.copy_(torch.tensor(bias))
    return policy
