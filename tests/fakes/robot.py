"""The suite's one fake robot: a ``hal.driver.RobotDriver`` whose hardware is a point in 3-D.

It passes the driver contract (tests/hal/test_contract.py runs it beside the real drivers), so
every test that needs "a robot" without a simulator uses it: the edge agent's control loop, its
cloud control, remote inference, operators. Faults come from subclasses overriding a hook
(a NaN in ``_get_observation``, weights offered from ``send_action``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hal.driver import Applied, EpisodeState, Observation, RobotDriver
from hal.spec import Capabilities, Feature, RobotSpec

STATE_DIM = 3
ACTION_DIM = 4
GAIN = 0.01  # metres moved per unit of action and step


@dataclass
class DeviceEpisode(EpisodeState):
    """hal's episode plus ``info``: what the robot's own teleoperation device claims about the
    last step (``{"is_intervention": bool}``), as a driver with a leader arm reports it."""

    info: dict[str, Any] = field(default_factory=dict)


def point_spec(
    episode_steps: int | None, has_operator_device: bool = False, can_reset: bool = True
) -> RobotSpec:
    """The fake's spec: ``observation.state`` (3,) float32, ``action`` (4,) float32 in [-1, 1]
    (dx, dy, dz and an unused gripper), 200 Hz, truncated after ``episode_steps``;
    ``can_reset`` False declares an arm a person resets."""
    return RobotSpec(
        robot_type="point-robot",
        observation_features={
            "observation.state": Feature(dtype="float32", shape=(STATE_DIM,)),
        },
        action_features={"action": Feature(dtype="float32", shape=(ACTION_DIM,))},
        control_hz=200.0,
        capabilities=Capabilities(
            can_reset=can_reset,
            simulated=True,
            has_operator_device=has_operator_device,
            reward="dense",
        ),
        action_low=[-1.0] * ACTION_DIM,
        action_high=[1.0] * ACTION_DIM,
        max_episode_steps=episode_steps,
    )


class PointRobot(RobotDriver):
    """A point that integrates the action: ``pos += 0.01 * action[:3]`` per step.

    ``reset`` puts it back at the origin; the reward is ``-|pos|`` (metres); episodes truncate
    after ``episode_steps`` actions (hal's step limit). Any task name is accepted.

    Args:
        episode_steps: actions per episode before it is truncated (None: never).
        env_intervention: what the robot's own device claims for every step in
            ``episode.info["is_intervention"]`` (a leader arm overriding the policy).
        name: the robot's name.
        can_reset: False declares a robot that a person resets (``capabilities.can_reset``);
            ``reset`` then leaves the point where it is, as an arm's driver does.

    Attributes:
        pos: (3,) float32 position now.
        sent: every action the robot executed, after clipping, in order.
    """

    def __init__(
        self,
        episode_steps: int | None = 10,
        env_intervention: bool = False,
        name: str = "point-0",
        can_reset: bool = True,
    ) -> None:
        super().__init__(name)
        self.spec = point_spec(episode_steps, env_intervention, can_reset)
        self.env_intervention = env_intervention
        self.episode: DeviceEpisode = DeviceEpisode()
        self.pos = np.zeros(STATE_DIM, np.float32)
        self.sent: list[NDArray[np.float32]] = []

    def reset(self, task: str | None = None, seed: int | None = None) -> Observation:
        obs = super().reset(task, seed)
        self.episode = DeviceEpisode(task=self.episode.task, seed=seed)
        return obs

    def _connect(self) -> None:
        return None

    def _disconnect(self) -> None:
        return None

    def _reset(self, task: str, seed: int | None) -> Observation:
        if self.spec.capabilities.can_reset:
            self.pos[:] = 0
        return self._get_observation()

    def _get_observation(self) -> Observation:
        return {"observation.state": self.pos.copy()}

    def _apply_action(self, action: NDArray[np.float32]) -> Applied:
        self.sent.append(action)
        self.pos += GAIN * action[:STATE_DIM]
        self.episode.info = {"is_intervention": self.env_intervention}
        return Applied(sent=action, reward=-float(np.linalg.norm(self.pos)))
