"""Fleet settings (the ``hal:`` section, ``ROBOFLEET_HAL__*``)."""

from typing import Any

from pydantic import BaseModel, Field


class RobotDeclaration(BaseModel):
    """A robot attached to this machine, declared in the config (sim robots, known arms).

    ``driver`` is a kind of ``hal.drivers.make_driver`` (metaworld, gymnasium, lerobot, ros2,
    or a lab's own driver: ``my_pkg.arms:MyArm`` or a ``robofleet.drivers`` entry point name)
    and ``options`` its keyword arguments, e.g. ``{"task": "reach-v3"}`` or
    ``{"type": "so100_follower", "config": {"port": "/dev/ttyACM0"}}``.
    """

    name: str
    driver: str
    options: dict[str, Any] = Field(default_factory=dict)
    tags: dict[str, Any] = Field(default_factory=dict)


class HalSettings(BaseModel):
    """Robot discovery, liveness and scheduling."""

    heartbeat_interval_s: float = Field(default=1.0, gt=0, description="How often robots report.")
    offline_after_s: float = Field(
        default=10.0, gt=0, description="A robot with no heartbeat for this long is marked offline."
    )
    robots: list[RobotDeclaration] = Field(
        default_factory=list, description="Robots attached to this node (see RobotDeclaration)."
    )
    serial_globs: list[str] = Field(
        default_factory=lambda: ["/dev/ttyACM*", "/dev/ttyUSB*"],
        description="Serial ports probed for LeRobot arms not declared in robots.",
    )
    serial_robot_type: str = Field(
        default="so100_follower", description="LeRobot type assumed for an undeclared serial arm."
    )
    dds_domains: list[int] = Field(
        default_factory=list, description="ROS_DOMAIN_IDs probed for JointState publishers."
    )
    dds_probe_s: float = Field(default=1.5, gt=0, description="DDS discovery wait per domain.")
    dds_loopback_only: bool = Field(default=False, description="Probe DDS on lo only.")
    node_ip: str | None = Field(
        default=None, description="This node's address as Ray sees it (default: auto)."
    )
    placement_timeout_s: float = Field(
        default=60.0, gt=0, description="How long a run waits for its placement group."
    )
