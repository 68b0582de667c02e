"""Evaluation episodes: the policy alone on a robot (the operator never acts), seeded per task.

One function serves every evaluator: the run's evaluation process on simulated robots, the
single-process HG-DAgger loop, the benches. It runs on any ``hal`` driver (the driver
contract's ``reset(task, seed)``, ``send_action``, ``get_observation`` and its episode state),
so the same episodes run on a simulated robot and on a real one whose driver reports success.

An episode succeeds when the driver's episode reports ``success`` within ``max_steps`` actions
(Meta-World's ``info["success"]``); it fails when it terminates, is truncated or runs out of
steps first. Seeds make the episodes a fixed test set: the same seeds, the same start states.

A chunked policy's (T, A) chunk is executed as the robots execute it: one row per step, the
policy asked again only when the chunk is spent (``edge_agent.inference``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from cloud_learner.core import Policy

if TYPE_CHECKING:
    from hal.driver import RobotDriver


def evaluate(
    policy: Policy,
    driver: RobotDriver,
    tasks: Sequence[str],
    seeds: Sequence[int],
    max_steps: int,
) -> dict[str, float]:
    """Success rate (0..1) per task over one episode per seed; ``task_index`` = position in
    ``tasks``. Actions are clipped to [-1, 1] (the policies' range). ``driver`` must be
    connected; it is left connected."""
    out: dict[str, float] = {}
    for task_index, task in enumerate(tasks):
        wins = sum(_episode(policy, driver, task, task_index, seed, max_steps) for seed in seeds)
        out[task] = wins / len(seeds)
    return out


def _episode(
    policy: Policy, driver: RobotDriver, task: str, task_index: int, seed: int, max_steps: int
) -> bool:
    obs = driver.reset(task=task, seed=seed)
    chunk: list[np.ndarray] = []
    for _ in range(max_steps):
        if not chunk:  # (A,) is a chunk of one
            chunk = list(np.atleast_2d(policy.act(obs, task_index)))
        driver.send_action({"action": np.clip(chunk.pop(0), -1.0, 1.0)})
        episode = driver.episode
        if episode.success:
            return True
        if episode.terminated or episode.truncated:
            return False
        obs = driver.get_observation()
    return False
