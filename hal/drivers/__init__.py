"""Driver registry: ``make_driver(kind, name, **options)`` builds a driver by its kind.

Kinds: ``metaworld``, ``gymnasium``, ``lerobot``, ``ros2``. Modules are imported lazily so an
edge computer without, say, MuJoCo can still run a LeRobot arm.
"""

from __future__ import annotations

import importlib
from typing import Any

from hal.driver import RobotDriver

DRIVER_KINDS: dict[str, str] = {
    "metaworld": "hal.drivers.metaworld:MetaWorldDriver",
    "gymnasium": "hal.drivers.gym:GymnasiumDriver",
    "lerobot": "hal.drivers.lerobot:LeRobotDriver",
    "ros2": "hal.drivers.ros2:Ros2Driver",
}


def make_driver(kind: str, name: str, **options: Any) -> RobotDriver:
    """Build (not connect) a driver.

    Raises:
        ValueError: unknown ``kind`` (the message lists the known ones) or bad options.
    """
    target = DRIVER_KINDS.get(kind)
    if target is None:
        raise ValueError(f"unknown driver kind {kind!r}; known: {sorted(DRIVER_KINDS)}")
    module, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    try:
        driver: RobotDriver = cls(name, **options)
    except TypeError as exc:
        raise ValueError(f"driver {kind!r} for robot {name!r}: bad options: {exc}") from None
    return driver
