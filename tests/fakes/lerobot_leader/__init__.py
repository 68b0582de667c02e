"""A fake actuated LeRobot leader arm: LeRobot's ``Teleoperator`` interface without a motor bus.

No leader arm's Feetech/Dynamixel bus can run here, so this stands in at the ``Teleoperator``
level, following SO-101's leader: per-motor ``<motor>.pos`` float action and feedback features
(the follower's, ``tests.fakes.lerobot``), ``send_feedback`` writes goal positions while the
torque is on, ``enable_torque`` / ``disable_torque``. ``move`` is the person's hand; it raises
while the torque holds the arm, so a test sees a leader that was not released.
"""

from __future__ import annotations

from typing import Any

from lerobot.teleoperators import Teleoperator

from tests.fakes.lerobot import MOTORS
from tests.fakes.lerobot_leader.config_fake_leader import FakeLeaderConfig


class FakeLeader(Teleoperator):
    config_class = FakeLeaderConfig
    name = "fake_leader"

    def __init__(self, config: FakeLeaderConfig) -> None:
        super().__init__(config)
        self.config = config
        self._connected = False
        self.torque = False
        self.positions = dict.fromkeys(MOTORS, 0.0)
        self.feedback: list[dict[str, float]] = []
        self.fail_reads = False  # the bus stops answering (a cable pulled mid-takeover)

    @property
    def action_features(self) -> dict[str, type]:
        return {f"{m}.pos": float for m in MOTORS}

    @property
    def feedback_features(self) -> dict[str, type]:
        return self.action_features

    @property
    def is_connected(self) -> bool:
        return self._connected

    def connect(self, calibrate: bool = True) -> None:
        if self.config.unplugged:
            raise ConnectionError(f"Could not connect on port '{self.config.port}'")
        self._connected = True

    @property
    def is_calibrated(self) -> bool:
        return self.config.calibrated

    def calibrate(self) -> None:
        pass

    def configure(self) -> None:
        pass

    def get_action(self) -> dict[str, float]:
        if not self._connected:
            raise RuntimeError(f"{self} is not connected")
        if self.fail_reads:
            raise ConnectionError(
                "Failed to sync read 'Present_Position' on ids=[1, 2, 3, 4, 5, 6]"
            )
        return {f"{m}.pos": v for m, v in self.positions.items()}

    def send_feedback(self, feedback: dict[str, Any]) -> None:
        if self.torque:
            self.feedback.append(dict(feedback))
            self.positions.update({k.removesuffix(".pos"): float(v) for k, v in feedback.items()})

    def enable_torque(self) -> None:
        self.torque = True

    def disable_torque(self) -> None:
        self.torque = False

    def move(self, **positions: float) -> None:
        """The person moves the arm by hand (motor name -> position)."""
        if self.torque:
            raise RuntimeError("the leader's torque holds it: a person cannot move it")
        self.positions.update(positions)

    def disconnect(self) -> None:
        self._connected = False
