"""A stand-in ROS 2 robot in its own process (what hal's Ros2Driver talks to): publishes
sensor_msgs/JointState at 100 Hz whose positions follow the last command received, and echoes
each command on ``/joint_commands_echo``.

Run: python -m tests.fakes.ros2_robot DOMAIN_ID joint1,joint2,...; :func:`ros2_robot` starts it
for a test.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cyclonedds.core import Policy, Qos
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic

from hal.ros2.dds import participant
from hal.ros2.types import JointState, dds_topic
from tests.fakes.procs import Child, python_module

JOINTS = ["joint1", "joint2", "joint3"]


@dataclass
class Ros2Robot:
    """A running stand-in: its DDS domain, joint names and process."""

    domain_id: int
    joints: list[str]
    child: Child


@contextmanager
def ros2_robot(domain_id: int, joints: list[str] = JOINTS) -> Iterator[Ros2Robot]:
    """Run the stand-in on ``domain_id`` (loopback only) until the block ends (then SIGKILL)."""
    child = Child(python_module("tests.fakes.ros2_robot", str(domain_id), ",".join(joints)))
    try:
        assert child.line(60) == "ready", "the ROS 2 robot did not start"
        yield Ros2Robot(domain_id, list(joints), child)
    finally:
        child.kill()


def main() -> None:
    domain, joints = int(sys.argv[1]), sys.argv[2].split(",")
    dp = participant(domain, loopback_only=True)
    state_w = DataWriter(dp, Topic(dp, dds_topic("/joint_states"), JointState))
    echo_w = DataWriter(dp, Topic(dp, dds_topic("/joint_commands_echo"), JointState))
    # Keep every command (the default history keeps only the newest one), so each is echoed.
    qos = Qos(Policy.Reliability.Reliable(0), Policy.History.KeepLast(256))
    cmd_r = DataReader(dp, Topic(dp, dds_topic("/joint_commands"), JointState), qos=qos)
    position = [0.0] * len(joints)
    print("ready", flush=True)
    while True:
        for cmd in cmd_r.take(64):
            if not isinstance(cmd, JointState):  # a writer went away (InvalidSample)
                continue
            index = {n: i for i, n in enumerate(cmd.name)}
            position = [
                cmd.position[index[j]] if j in index else p
                for j, p in zip(joints, position, strict=True)
            ]
            echo_w.write(cmd)
        state_w.write(
            JointState(name=joints, position=position, velocity=[0.0] * len(joints), effort=[])
        )
        time.sleep(0.01)


if __name__ == "__main__":
    main()
