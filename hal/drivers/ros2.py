"""A ROS 2 robot over DDS: reads ``sensor_msgs/JointState``, commands joint positions.

Uses cyclonedds with ROS 2's wire types (``hal.ros2.types``), so it talks to rclpy/rclcpp
nodes without a ROS installation. Commands go out as ``sensor_msgs/JointState`` with target
positions (the message ros2_control's joint-state command interfaces and Isaac Sim accept).
Safety: targets are clipped to the joint limits and to ``max_step`` (rad or m) from the last
measured position, the same rule as LeRobot's ``max_relative_target``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hal.driver import Applied, DriverError, Observation, RobotDriver
from hal.spec import Capabilities, Feature, RobotSpec


class Ros2Driver(RobotDriver):
    """Args:
        name: robot name.
        joints: joint names, in the order of the state and action vectors.
        state_topic / command_topic: ROS 2 topics (``/joint_states``, ``/joint_commands``).
        domain_id: ROS_DOMAIN_ID.
        loopback_only: keep DDS traffic on ``lo`` (tests, single-machine set-ups).
        position_low / position_high: joint limits (rad or m), one per joint.
        max_step: largest change of a target from the measured position per action.
        control_hz: control rate.
        state_timeout_s: no JointState for this long means unhealthy.
        connect_timeout_s: how long ``connect`` waits for the first JointState.
        robot_type: scheduling type.
        max_episode_steps: truncation limit (None: episodes end when the operator says).

    Raises:
        ValueError: no joints, or limits of the wrong length.
    """

    def __init__(
        self,
        name: str,
        joints: Sequence[str],
        state_topic: str = "/joint_states",
        command_topic: str = "/joint_commands",
        domain_id: int = 0,
        loopback_only: bool = False,
        position_low: Sequence[float] | None = None,
        position_high: Sequence[float] | None = None,
        max_step: float | None = None,
        control_hz: float = 50.0,
        state_timeout_s: float = 1.0,
        connect_timeout_s: float = 10.0,
        robot_type: str = "ros2-arm",
        max_episode_steps: int | None = None,
    ) -> None:
        super().__init__(name)
        self.joints = list(joints)
        if not self.joints:
            raise ValueError(f"robot {name}: joints must name at least one joint")
        if max_step is not None and max_step <= 0:
            raise ValueError(f"robot {name}: max_step must be positive, got {max_step}")
        n = len(self.joints)
        self.spec = RobotSpec(
            robot_type=robot_type,
            observation_features={
                "observation.state": Feature(
                    dtype="float32",
                    shape=(2 * n,),
                    names=[f"{j}.pos" for j in self.joints] + [f"{j}.vel" for j in self.joints],
                )
            },
            action_features={
                "action": Feature(
                    dtype="float32", shape=(n,), names=[f"{j}.pos" for j in self.joints]
                )
            },
            control_hz=control_hz,
            capabilities=Capabilities(can_reset=False, simulated=False),
            action_low=list(position_low) if position_low is not None else None,
            action_high=list(position_high) if position_high is not None else None,
            max_episode_steps=max_episode_steps,
        )
        self.state_topic = state_topic
        self.command_topic = command_topic
        self.domain_id = domain_id
        self._loopback_only = loopback_only
        self._max_step = max_step
        self._state_timeout_s = state_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._dp: Any = None
        self._reader: Any = None
        self._writer: Any = None
        self._state: NDArray[np.float32] | None = None
        self._last_state_at = 0.0

    def _connect(self) -> None:
        from cyclonedds.pub import DataWriter
        from cyclonedds.sub import DataReader
        from cyclonedds.topic import Topic

        from hal.ros2.dds import participant
        from hal.ros2.types import JointState, dds_topic

        self._dp = participant(self.domain_id, loopback_only=self._loopback_only)
        self._reader = DataReader(
            self._dp, Topic(self._dp, dds_topic(self.state_topic), JointState)
        )
        self._writer = DataWriter(
            self._dp, Topic(self._dp, dds_topic(self.command_topic), JointState)
        )
        deadline = time.monotonic() + self._connect_timeout_s
        while self._state is None and time.monotonic() < deadline:
            self._poll()
            time.sleep(0.01)
        if self._state is None:
            self._dp = self._reader = self._writer = None
            raise DriverError(
                f"robot {self.name}: no JointState on {self.state_topic} (domain "
                f"{self.domain_id}) within {self._connect_timeout_s}s"
            )

    def _disconnect(self) -> None:
        # cyclonedds entities are freed with their participant.
        self._dp = self._reader = self._writer = None
        self._state = None

    def _poll(self) -> None:
        """Take every waiting JointState and keep the newest, reordered to ``joints``."""
        for msg in self._reader.take(64):
            index = {n: i for i, n in enumerate(msg.name)}
            missing = [j for j in self.joints if j not in index]
            if missing:
                raise DriverError(
                    f"robot {self.name}: JointState on {self.state_topic} lacks joints {missing}"
                )
            pos = [msg.position[index[j]] for j in self.joints]
            vel = [
                msg.velocity[index[j]] if len(msg.velocity) == len(msg.name) else 0.0
                for j in self.joints
            ]
            self._state = np.asarray(pos + vel, dtype=np.float32)
            self._last_state_at = time.monotonic()

    def _get_observation(self) -> Observation:
        self._poll()
        assert self._state is not None
        return {"observation.state": self._state.copy()}

    def _apply_action(self, action: NDArray[np.float32]) -> Applied:
        from hal.ros2.types import Header, JointState, Time

        self._poll()
        target = action
        if self._max_step is not None and self._state is not None:
            current = self._state[: len(self.joints)]
            target = np.clip(action, current - self._max_step, current + self._max_step).astype(
                np.float32
            )
        now = time.time()
        stamp = Time(sec=int(now), nanosec=int((now % 1) * 1e9))
        # cyclonedds annotates sequence fields with its marker type; lists are what it takes.
        msg: Any = JointState(header=Header(stamp=stamp))
        msg.name = list(self.joints)
        msg.position = [float(x) for x in target]
        self._writer.write(msg)
        return Applied(sent=target)

    def _reset(self, task: str, seed: int | None) -> Observation:
        # A real robot is put back by a person; the episode starts from where it is.
        return self._get_observation()

    def _healthy(self) -> bool:
        with self._lock:
            self._poll()
        return time.monotonic() - self._last_state_at < self._state_timeout_s
