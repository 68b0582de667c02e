"""Fixtures of the hal tests: a stand-in ROS 2 robot process, unique DDS domains."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROS_JOINTS = ["joint1", "joint2", "joint3"]
_domains = itertools.count()


def unique_domain_id() -> int:
    """A DDS domain no other test (or other engineer's run) on this machine is using now."""
    return 1 + (os.getpid() * 7 + next(_domains)) % 230


@dataclass
class EchoRobot:
    domain_id: int
    joints: list[str]
    proc: subprocess.Popen[str]


@pytest.fixture
def ros2_echo() -> Iterator[EchoRobot]:
    """A separate process publishing ROS 2 JointState on loopback and echoing commands."""
    domain = unique_domain_id()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.hal.ros2_echo", str(domain), ",".join(ROS_JOINTS)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", "echo robot did not start"
        yield EchoRobot(domain, ROS_JOINTS, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
