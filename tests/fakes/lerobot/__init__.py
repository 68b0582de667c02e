"""A fake LeRobot follower arm: the lerobot ``Robot`` interface without hardware (what hal's
LeRobotDriver talks to; ``make_driver("lerobot", ..., module="tests.fakes.lerobot")``).

It follows LeRobot's conventions exactly (per-motor ``<motor>.pos`` float features, a camera
as an (H, W, 3) tuple, ``send_action`` clipping with ``ensure_safe_goal_position`` and
returning what was sent, errors when not connected), so a real arm passes the same tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from lerobot.robots import Robot
from lerobot.robots.utils import ensure_safe_goal_position

from tests.fakes.lerobot.config_fake_follower import FakeFollowerConfig

MOTORS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]


class FakeFollower(Robot):
    config_class = FakeFollowerConfig
    name = "fake_follower"

    def __init__(self, config: FakeFollowerConfig) -> None:
        super().__init__(config)
        self.config = config
        self._connected = False
        self.positions = dict.fromkeys(MOTORS, 0.0)
        self.sent: list[dict[str, float]] = []

    @property
    def observation_features(self) -> dict[str, Any]:
        cam = (self.config.camera_height, self.config.camera_width, 3)
        return {**{f"{m}.pos": float for m in MOTORS}, "front": cam}

    @property
    def action_features(self) -> dict[str, Any]:
        return {f"{m}.pos": float for m in MOTORS}

    @property
    def is_connected(self) -> bool:
        return self._connected

    def connect(self, calibrate: bool = True) -> None:
        if self._connected:
            raise RuntimeError(f"{self} already connected")
        self._connected = True

    @property
    def is_calibrated(self) -> bool:
        return True

    def calibrate(self) -> None:
        pass

    def configure(self) -> None:
        pass

    def get_observation(self) -> dict[str, Any]:
        if not self._connected:
            raise RuntimeError(f"{self} is not connected")
        obs: dict[str, Any] = {f"{m}.pos": self.positions[m] for m in MOTORS}
        h, w = self.config.camera_height, self.config.camera_width
        obs["front"] = np.full((h, w, 3), int(abs(self.positions["gripper"])) % 256, np.uint8)
        return obs

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        if not self._connected:
            raise RuntimeError(f"{self} is not connected")
        goal = {k.removesuffix(".pos"): float(v) for k, v in action.items()}
        if self.config.max_relative_target is not None:
            present = {m: (goal[m], self.positions[m]) for m in goal}
            goal = ensure_safe_goal_position(present, self.config.max_relative_target)
        self.positions.update(goal)
        sent = {f"{m}.pos": v for m, v in goal.items()}
        self.sent.append(sent)
        return sent

    def disconnect(self) -> None:
        if not self._connected:
            raise RuntimeError(f"{self} is not connected")
        self._connected = False
