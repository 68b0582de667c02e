"""Evaluation episodes execute a chunked policy's chunks row by row, as the robots do."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cloud_learner.evaluation import evaluate
from tests.fakes.robot import ACTION_DIM, PointRobot


class ChunkPolicy:
    """Returns a (T, A) chunk whose rows number the actions: row i of call c is c * T + i."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls = 0

    def act(self, observation: Mapping[str, np.ndarray], task: int) -> np.ndarray:
        first = self.calls * self.size
        self.calls += 1
        rows = np.arange(first, first + self.size, dtype=np.float32)[:, None]
        return np.repeat(rows / 100.0, ACTION_DIM, axis=1)


def test_a_chunk_is_executed_one_row_per_step_and_inferred_again_when_spent():
    robot = PointRobot(episode_steps=7)
    robot.connect()
    policy = ChunkPolicy(size=3)
    # Two seeds of 7 steps each; each episode starts with a fresh chunk.
    assert evaluate(policy, robot, ["reach"], seeds=[0, 1], max_steps=7) == {"reach": 0.0}  # type: ignore[arg-type]
    assert policy.calls == 2 * 3  # ceil(7 / 3) per episode
    sent = [round(float(a[0]) * 100) for a in robot.sent]
    first = [0, 1, 2, 3, 4, 5, 6]
    second = [9, 10, 11, 12, 13, 14, 15]  # the first episode's last chunk (6..8) is dropped
    assert sent == first + second
    assert all(a.shape == (ACTION_DIM,) for a in robot.sent)


def test_a_single_action_policy_is_asked_every_step():
    robot = PointRobot(episode_steps=5)
    robot.connect()
    calls = []

    class One:
        def act(self, observation: Mapping[str, np.ndarray], task: int) -> np.ndarray:
            calls.append(task)
            return np.full(ACTION_DIM, 0.5, np.float32)

    evaluate(One(), robot, ["a", "b"], seeds=[3], max_steps=5)  # type: ignore[arg-type]
    assert calls == [0] * 5 + [1] * 5
