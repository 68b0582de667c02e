"""Shared DDS set-up: one cyclonedds Domain per id per process, optionally loopback-only."""

from __future__ import annotations

import threading
import time
from typing import Any

from hal.ros2.types import JOINT_STATE_TYPE, loopback_config, ros_topic

_domains: dict[int, Any] = {}
_lock = threading.Lock()


def participant(domain_id: int, *, loopback_only: bool = False) -> Any:
    """A ``DomainParticipant`` on ``domain_id`` (0-232).

    ``loopback_only`` configures the domain (once per process, before its first participant)
    to use only ``lo`` with unicast discovery on 127.0.0.1.

    Raises:
        ValueError: ``domain_id`` out of DDS's range.
    """
    from cyclonedds.domain import Domain, DomainParticipant

    if not 0 <= domain_id <= 232:
        raise ValueError(f"DDS domain id must be 0..232, got {domain_id}")
    with _lock:
        if loopback_only and domain_id not in _domains:
            _domains[domain_id] = Domain(domain_id, loopback_config(domain_id))
        return DomainParticipant(domain_id)


def joint_state_topics(
    domain_id: int, *, wait_s: float = 1.5, loopback_only: bool = False
) -> list[str]:
    """ROS 2 topic names on which someone publishes ``sensor_msgs/JointState`` (DDS discovery).

    Waits up to ``wait_s`` seconds for discovery; returns sorted names like ``/arm/joint_states``.
    """
    from cyclonedds.builtin import BuiltinDataReader, BuiltinTopicDcpsPublication

    dp = participant(domain_id, loopback_only=loopback_only)
    reader = BuiltinDataReader(dp, BuiltinTopicDcpsPublication)
    found: set[str] = set()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for sample in reader.take(64):
            name = ros_topic(getattr(sample, "topic_name", "") or "")
            if name and getattr(sample, "type_name", "") == JOINT_STATE_TYPE:
                found.add(name)
        time.sleep(0.05)
    return sorted(found)
