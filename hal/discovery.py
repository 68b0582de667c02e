"""Node probe: which robots are attached to this machine, with their specs.

Sources: robots declared in the ``hal.robots`` config (sim robots, known arms), serial ports
matching ``hal.serial_globs`` that no declared robot claims (LeRobot arms of
``hal.serial_robot_type``), and ROS 2 ``JointState`` publishers seen by DDS discovery on
``hal.dds_domains``. Building a driver reads its spec without connecting, so probing never
moves a robot.
"""

from __future__ import annotations

import glob
import logging
import re
import socket
import time
from typing import Any

from hal.config import HalSettings
from hal.drivers import make_driver
from hal.fleet import RobotReport

log = logging.getLogger(__name__)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"


def _report(
    name: str, driver: str, options: dict[str, Any], tags: dict[str, Any], source: str
) -> RobotReport:
    d = make_driver(driver, name, **options)
    return RobotReport(
        name=name,
        driver=driver,
        robot_type=d.spec.robot_type,
        spec=d.spec.to_dict(),
        options=options,
        tags=tags,
        source=source,
    )


def probe_declared(settings: HalSettings) -> list[RobotReport]:
    """Reports of config-declared robots. Raises ValueError naming a robot with bad options."""
    return [_report(r.name, r.driver, r.options, r.tags, "config") for r in settings.robots]


def probe_serial(settings: HalSettings, host: str) -> list[RobotReport]:
    """LeRobot arms on serial ports no declared robot claims (named ``<host>-<port>``)."""
    claimed = {
        str(r.options.get("config", {}).get("port"))
        for r in settings.robots
        if r.driver == "lerobot" and isinstance(r.options.get("config"), dict)
    }
    ports = sorted({p for pattern in settings.serial_globs for p in glob.glob(pattern)})
    reports = []
    for port in ports:
        if port in claimed:
            continue
        name = _slug(f"{host}-{port.rsplit('/', 1)[-1]}")
        options = {"type": settings.serial_robot_type, "config": {"port": port}}
        try:
            reports.append(_report(name, "lerobot", options, {"port": port}, "serial"))
        except ValueError as exc:
            log.warning("serial port %s: not a %s: %s", port, settings.serial_robot_type, exc)
    return reports


def probe_dds(settings: HalSettings, host: str) -> list[RobotReport]:
    """ROS 2 robots: one per JointState topic per probed domain, joints read from a sample."""
    from hal.ros2.dds import joint_state_topics

    reports = []
    for domain in settings.dds_domains:
        topics = joint_state_topics(
            domain, wait_s=settings.dds_probe_s, loopback_only=settings.dds_loopback_only
        )
        for topic in topics:
            joints = _joint_names(domain, topic, settings)
            if not joints:
                continue
            name = _slug(f"{host}-ros2-d{domain}{topic.replace('/', '-')}")
            options = {
                "joints": joints,
                "state_topic": topic,
                "domain_id": domain,
                "loopback_only": settings.dds_loopback_only,
            }
            reports.append(_report(name, "ros2", options, {"topic": topic}, "dds"))
    return reports


def _joint_names(domain: int, topic: str, settings: HalSettings) -> list[str]:
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic

    from hal.ros2.dds import participant
    from hal.ros2.types import JointState, dds_topic

    dp = participant(domain, loopback_only=settings.dds_loopback_only)
    reader = DataReader(dp, Topic(dp, dds_topic(topic), JointState))
    deadline = time.monotonic() + settings.dds_probe_s
    while time.monotonic() < deadline:
        for msg in reader.take(1):
            return [str(n) for n in msg.name]  # type: ignore[attr-defined]
        time.sleep(0.02)
    return []


def probe(settings: HalSettings, host: str | None = None) -> list[RobotReport]:
    """Every robot attached to this node (declared, serial, DDS), de-duplicated by name.

    Raises:
        ValueError: two declared robots share a name, or a declared robot has bad options.
    """
    host = _slug(host or socket.gethostname())
    names = [r.name for r in settings.robots]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"robots declared twice in hal.robots: {dupes}")
    found: dict[str, RobotReport] = {}
    for report in [
        *probe_declared(settings),
        *probe_serial(settings, host),
        *probe_dds(settings, host),
    ]:
        found.setdefault(report.name, report)
    return list(found.values())
