"""Every seam of the edge agent in one file; read this first.

One control step of :class:`edge_agent.agent.EdgeAgent`, in full::

    obs = driver.get_observation()                      # Driver (hal contract)
    weights.apply_if_due(boundary)                      # WeightSlot: swap only at a safe boundary
    proposed, version = runner.act(obs, task)           # PolicyRunner: local policy or cloud Act
    op = operator.step(obs, proposed)                   # InterventionSource: expert/keyboard/pad
    command = op.action if op.is_intervention else proposed
    executed = driver.send_action(command)              # what the robot REALLY did
    uplink.submit(row)                                  # -> durable spool (seq) -> comms Uploader

Shapes: ``observation.state`` is ``(D,) float32``; ``observation.images.<cam>`` is
``(H, W, C) uint8``; ``action`` is ``(A,) float32``. A policy may return a chunk ``(T, A)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

Observation = dict[str, Any]


class EpisodeView(Protocol):
    """The robot's view of its current episode (hal's ``EpisodeState``): Gymnasium's step
    outcome after the last ``send_action``. A driver with its own teleoperation device may
    also expose ``info = {"is_intervention": bool}``."""

    reward: float
    terminated: bool
    truncated: bool
    success: bool


@runtime_checkable
class Driver(Protocol):
    """A robot, shaped like LeRobot's ``Robot`` (what hal's ``RobotDriver`` implements).

    ``observation_features`` / ``action_features`` are LeRobot feature dicts known before
    ``connect``. ``reset(task=...)`` starts an episode and returns its first observation;
    ``get_observation`` returns ``{feature key: np.ndarray}``; ``send_action({"action": a})``
    returns ``{"action": what was really sent}`` (after clipping) and updates ``episode``.
    """

    episode: Any

    @property
    def observation_features(self) -> Mapping[str, Any]: ...

    @property
    def action_features(self) -> Mapping[str, Any]: ...

    @property
    def control_hz(self) -> float: ...

    def connect(self) -> None: ...

    def disconnect(self) -> None: ...

    def reset(self, task: str | None = None, seed: int | None = None) -> Observation: ...

    def get_observation(self) -> Observation: ...

    def send_action(self, action: Any) -> Any: ...

    def estop(self) -> None: ...

    def is_healthy(self) -> bool: ...


@runtime_checkable
class PolicyRunner(Protocol):
    """Produces the novice's action for one control step.

    ``act`` returns ``(action (A,) float32, policy_version)``; ``policy_version`` is -1 when no
    policy produced the action (the remote runner's safe hold after a missed deadline).
    ``at_chunk_boundary`` is True when the next ``act`` starts a new action chunk (always True
    for single-action policies); weights may be swapped only there or at episode end.
    """

    @property
    def policy_version(self) -> int: ...

    @property
    def at_chunk_boundary(self) -> bool: ...

    def act(self, observation: Observation, task: int) -> tuple[np.ndarray, int]: ...

    def set_weights(self, version: int, weights: Mapping[str, Any]) -> None: ...

    def reset(self) -> None: ...


@dataclass
class OperatorInput:
    """What an intervention source decided for one step.

    Attributes:
        is_intervention: the operator, not the policy, chose this step's action.
        action: the operator's action ``(A,) float32`` (None when not intervening).
        command: an episode command: ``"rerecord"`` (discard this episode), ``"success"`` /
            ``"failure"`` (operator's label, ends the episode), ``"estop"``; None for none.
        reason: why the source intervened (``"divergence"``, ``"risk_region"``, ``"handback"``,
            ``"key"``, ``"button"``...), for logs and tests.
    """

    is_intervention: bool = False
    action: np.ndarray | None = None
    command: str | None = None
    reason: str = ""


@runtime_checkable
class InterventionSource(Protocol):
    """A human (or the simulated operator) who may take over any step."""

    def step(self, observation: Observation, proposed: np.ndarray) -> OperatorInput: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...
