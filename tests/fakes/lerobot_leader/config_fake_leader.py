"""Config of the fake LeRobot leader arm (registered as ``fake_leader``)."""

from dataclasses import dataclass

from lerobot.teleoperators import TeleoperatorConfig


@TeleoperatorConfig.register_subclass("fake_leader")
@dataclass
class FakeLeaderConfig(TeleoperatorConfig):
    port: str = "/dev/ttyFAKE1"
    calibrated: bool = True  # False: a leader whose calibration file is missing
    unplugged: bool = False  # True: connect fails as a missing serial port does
