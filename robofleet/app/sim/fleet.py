"""The simulated fleet's Meta-World constants and its scripted demonstrations.

The simulated robots themselves are robot computers like a lab's (:mod:`robofleet.app.sim.
computers`); :func:`demonstration_records` runs the scripted expert to produce the handful of
demonstrations the weak initial policy is cloned from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# Meta-World's goal-observable state and the Sawyer's action (hal.drivers.metaworld).
STATE_DIM = 39
ACTION_DIM = 4
DEMO_ROBOT = "demo"


def demonstration_records(
    tasks: Sequence[str], per_task: int, max_steps: int, run_id: str, first_seed: int = 20_000
) -> list[dict[str, Any]]:
    """Scripted-expert episodes as buffer step records (``is_intervention`` True, robot
    ``demo``), ``per_task`` per task, each ``max_steps`` long, seeds from ``first_seed``."""
    from hal.drivers.metaworld import MetaWorldDriver, expert_policy

    driver = MetaWorldDriver(DEMO_ROBOT, tasks=list(tasks), max_episode_steps=max_steps)
    records: list[dict[str, Any]] = []
    seq = 0
    driver.connect()  # hal's driver builds Meta-World's task lists under its own lock
    try:
        for t_i, task in enumerate(tasks):
            expert = expert_policy(task)
            for k in range(per_task):
                episode = t_i * per_task + k
                obs = driver.reset(task=task, seed=first_seed + episode)
                for frame in range(max_steps):
                    action = expert(obs)
                    driver.send_action({"action": action})
                    nxt = driver.get_observation()
                    done = frame == max_steps - 1
                    rec: dict[str, Any] = {
                        "seq": seq,
                        "robot_id": DEMO_ROBOT,
                        "run_id": run_id,
                        "task": task,
                        "episode_index": episode,
                        "frame_index": frame,
                        "timestamp": frame / 20.0,
                        "reward": float(driver.episode.reward),
                        "terminated": False,
                        "truncated": done,
                        "is_intervention": True,
                        "policy_version": 0,
                        "action": np.asarray(action, np.float32),
                        "observation.state": obs["observation.state"],
                    }
                    if done:
                        rec["next.observation.state"] = nxt["observation.state"]
                    records.append(rec)
                    seq += 1
                    obs = nxt
    finally:
        driver.disconnect()
    return records
