# mypy: disable-error-code="type-arg,assignment"
"""ROS 2 message types as cyclonedds IDL structs, with ROS 2's DDS type and topic names.

ROS 2 maps ``pkg/msg/Name`` to the DDS type ``pkg::msg::dds_::Name_`` and topic ``/x`` to
``rt/x`` (see ROS 2's rmw naming design, "Topic and Service name mapping to DDS"). Field order
and types follow the ``.msg`` definitions, so CDR bytes match what rclpy sends.
"""

# No "from __future__ import annotations": cyclonedds resolves the annotations at runtime.

from dataclasses import dataclass, field

from cyclonedds.idl import IdlStruct
from cyclonedds.idl.types import float64, int32, sequence, uint32


@dataclass
class Time(IdlStruct, typename="builtin_interfaces::msg::dds_::Time_"):
    """builtin_interfaces/Time: seconds and nanoseconds since the epoch."""

    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
class Header(IdlStruct, typename="std_msgs::msg::dds_::Header_"):
    """std_msgs/Header."""

    stamp: Time = field(default_factory=Time)
    frame_id: str = ""


@dataclass
class JointState(IdlStruct, typename="sensor_msgs::msg::dds_::JointState_"):
    """sensor_msgs/JointState: positions in rad or m, velocities in rad/s or m/s, efforts in
    N*m or N; arrays are empty or as long as ``name``."""

    header: Header = field(default_factory=Header)
    name: sequence[str] = field(default_factory=list)
    position: sequence[float64] = field(default_factory=list)
    velocity: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)


JOINT_STATE_TYPE = "sensor_msgs::msg::dds_::JointState_"


def dds_topic(ros_topic: str) -> str:
    """ROS 2 topic name (``/arm/joint_states``) -> DDS topic name (``rt/arm/joint_states``)."""
    if not ros_topic.startswith("/"):
        ros_topic = "/" + ros_topic
    return "rt" + ros_topic


def ros_topic(dds_name: str) -> str | None:
    """Inverse of :func:`dds_topic`; None for DDS topics that are not ROS 2 topics."""
    return dds_name[2:] if dds_name.startswith("rt/") else None


def loopback_config(domain_id: int) -> str:
    """Cyclone DDS XML keeping all traffic on ``lo`` (unicast discovery to 127.0.0.1)."""
    return (
        f'<CycloneDDS><Domain id="{domain_id}"><General><Interfaces>'
        '<NetworkInterface name="lo"/></Interfaces></General>'
        "<Discovery><ParticipantIndex>auto</ParticipantIndex><MaxAutoParticipantIndex>50"
        '</MaxAutoParticipantIndex><Peers><Peer address="127.0.0.1"/></Peers></Discovery>'
        "</Domain></CycloneDDS>"
    )
