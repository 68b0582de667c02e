"""Fixtures of the hal tests: a stand-in ROS 2 robot process, unique DDS domains."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from tests.fakes.ros2_robot import Ros2Robot, ros2_robot

_domains = itertools.count()


def unique_domain_id() -> int:
    """A DDS domain no other test (or other engineer's run) on this machine is using now."""
    return 1 + (os.getpid() * 7 + next(_domains)) % 230


@pytest.fixture
def ros2_echo() -> Iterator[Ros2Robot]:
    """A separate process publishing ROS 2 JointState on loopback and echoing commands."""
    with ros2_robot(unique_domain_id()) as robot:
        yield robot
