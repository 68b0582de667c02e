"""Config of the fake LeRobot follower arm (registered as ``fake_follower``)."""

from dataclasses import dataclass

from lerobot.robots import RobotConfig


@RobotConfig.register_subclass("fake_follower")
@dataclass
class FakeFollowerConfig(RobotConfig):
    port: str = "/dev/ttyFAKE0"
    max_relative_target: float | None = 5.0
    camera_height: int = 24
    camera_width: int = 32
