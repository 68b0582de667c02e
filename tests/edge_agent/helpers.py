"""Shared pieces of the edge agent tests: a tiny real policy, an agent builder, the spool's rows
(the robot is the suite's fake, tests.fakes.robot.PointRobot)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from buffer.table.schema import StepSchema
from edge_agent.agent import EdgeAgent
from edge_agent.config import EdgeSettings
from edge_agent.core import InterventionSource
from edge_agent.inference import LocalPolicyRunner
from edge_agent.rewards import RewardSource
from edge_agent.spool import Spool
from edge_agent.uplink import UplinkWorker
from edge_agent.weights import StagedWeights
from tests.fakes.settings import fast_edge


class BiasPolicy:
    """A real (torch) policy whose action reveals its weights: ``base(obs) + bias``.

    ``chunk`` > 1 returns a (chunk, A) action chunk. ``base`` defaults to zeros.
    """

    def __init__(self, action_dim: int = 4, chunk: int = 1, base: Any = None) -> None:
        self.bias = torch.zeros(action_dim)
        self.chunk = chunk
        self.base = base
        self.calls = 0

    def act(self, observation: Mapping[str, np.ndarray], task: int) -> np.ndarray:
        self.calls += 1
        b = self.bias.numpy().copy()
        a = b if self.base is None else np.asarray(self.base(observation), np.float32) + b
        return np.tile(a, (self.chunk, 1)) if self.chunk > 1 else a

    def get_weights(self) -> dict[str, torch.Tensor]:
        return {"bias": self.bias.clone()}

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        w = weights["bias"]
        if tuple(w.shape) != tuple(self.bias.shape):
            raise ValueError(f"bias shape {tuple(w.shape)} != {tuple(self.bias.shape)}")
        self.bias.copy_(w)


def make_agent(
    tmp: Path,
    driver: Any,
    policy: Any,
    *,
    operator: InterventionSource | None = None,
    settings: EdgeSettings | None = None,
    weights: StagedWeights | None = None,
    runner: Any = None,
    tasks: tuple[str, ...] = ("reach-v3",),
    demonstrations: dict[str, int] | None = None,
    rewards: RewardSource | None = None,
    **more: Any,
) -> EdgeAgent:
    settings = settings or fast_edge()
    schema = StepSchema.from_features(driver.observation_features, driver.action_features)
    spool = Spool(tmp / "spool", settings.spool_max_bytes, settings.spool_full_policy)
    up = UplinkWorker(spool, schema, batch_max_steps=settings.batch_max_steps).start()
    runner = runner or LocalPolicyRunner(policy, 4)
    return EdgeAgent(
        driver,
        runner,
        up,
        settings,
        robot_id="robot-1",
        run_id="run-1",
        tasks=list(tasks),
        operator=operator,
        weights=weights,
        demonstrations=demonstrations,
        rewards=rewards,
        **more,
    )


def spooled_rows(spool: Spool) -> pa.Table:
    """Every row still in the spool, in seq order."""
    batches = [b for e in spool.pending() if (b := spool.read(e)) is not None]
    return pa.Table.from_batches(batches)


class FixedOperator:
    """An intervention source with a fixed decision (for precedence tests)."""

    def __init__(self, intervene: bool, action: np.ndarray | None = None) -> None:
        self.intervene = intervene
        self.action = action

    def step(self, observation: Any, proposed: np.ndarray) -> Any:
        from edge_agent.core import OperatorInput

        if self.intervene:
            return OperatorInput(True, self.action, None, "fixed")
        return OperatorInput(False, None, None, "")

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass
