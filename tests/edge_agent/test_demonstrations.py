"""A run's demonstration phase on the robot: the operator drives the first episodes of each
task without any policy or weights (steps of policy_version 0, all the operator's), a restarted
agent records only the ones still missing, and then the policy's episodes begin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edge_agent.agent import EdgeAgent
from edge_agent.core import DEMONSTRATION, OperatorInput
from edge_agent.weights import StagedWeights
from tests.edge_agent.helpers import BiasPolicy, make_agent, spooled_rows
from tests.fakes.robot import PointRobot

LABEL = np.array([0.5, -0.5, 0.25, 0.0], np.float32)
DEMOS = {"a": 1, "b": 2}


class Demonstrator:
    """An operator whose demonstration is a fixed action; it never takes over otherwise."""

    def __init__(self) -> None:
        self.demonstrated = 0

    def demonstrate(self, observation: Any) -> OperatorInput:
        self.demonstrated += 1
        return OperatorInput(True, LABEL.copy(), None, "demonstration")

    def step(self, observation: Any, proposed: np.ndarray) -> OperatorInput:
        return OperatorInput()

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def agent(tmp_path: Path, weights: StagedWeights, operator: Demonstrator) -> EdgeAgent:
    return make_agent(
        tmp_path,
        PointRobot(episode_steps=5),
        BiasPolicy(),
        operator=operator,
        weights=weights,
        tasks=("a", "b"),
        demonstrations=DEMOS,
    )


def test_demonstrations_come_first_need_no_weights_and_survive_a_restart(tmp_path: Path) -> None:
    weights = StagedWeights()  # no version yet: a policy episode would wait for one
    first = agent(tmp_path, weights, Demonstrator())
    report = first.run(episodes=2)  # returns without any weights: the operator drives
    assert report["demonstrations"] == 2.0
    first.uplink.flush()
    rows = spooled_rows(first.uplink.spool)
    assert set(rows.column("policy_version").to_pylist()) == {DEMONSTRATION}
    assert all(rows.column("is_intervention").to_pylist())
    executed = np.stack(rows.column("action").to_numpy(zero_copy_only=False))
    assert np.allclose(executed, LABEL)
    assert rows.column("task").to_pylist() == ["a"] * 5 + ["b"] * 5
    first.uplink.close()

    # Restarted on the same spool it owes one demonstration of b, then the policy's turn.
    weights.offer(3, {"bias": torch.full((4,), 0.1)})
    operator = Demonstrator()
    second = agent(tmp_path, weights, operator)
    second.run(episodes=2)
    second.uplink.flush()
    rows = spooled_rows(second.uplink.spool)
    versions = rows.column("policy_version").to_pylist()
    assert versions[-10:] == [DEMONSTRATION] * 5 + [3] * 5
    assert rows.column("task").to_pylist()[-10:-5] == ["b"] * 5
    assert operator.demonstrated == 5
    second.uplink.close()


def test_demonstrations_of_tasks_the_robot_does_not_run_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"demonstrations of tasks \['z'\]"):
        make_agent(tmp_path, PointRobot(), BiasPolicy(), tasks=("a",), demonstrations={"z": 1})
