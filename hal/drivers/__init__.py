"""Driver registry: ``make_driver(kind, name, **options)`` builds a driver by its kind.

Kinds: ``metaworld``, ``gymnasium``, ``lerobot``, ``ros2``. Modules are imported lazily so an
edge computer without, say, MuJoCo can still run a LeRobot arm.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from hal.driver import EPISODE_OPTIONS, RobotDriver

DRIVER_KINDS: dict[str, str] = {
    "metaworld": "hal.drivers.metaworld:MetaWorldDriver",
    "gymnasium": "hal.drivers.gym:GymnasiumDriver",
    "lerobot": "hal.drivers.lerobot:LeRobotDriver",
    "ros2": "hal.drivers.ros2:Ros2Driver",
}


def driver_class(kind: str) -> type[RobotDriver]:
    """The driver class of ``kind`` (its module imported).

    Raises:
        ValueError: unknown ``kind`` (the message lists the known ones).
    """
    target = DRIVER_KINDS.get(kind)
    if target is None:
        raise ValueError(f"unknown driver kind {kind!r}; known: {sorted(DRIVER_KINDS)}")
    module, cls_name = target.split(":")
    cls: type[RobotDriver] = getattr(importlib.import_module(module), cls_name)
    return cls


def make_driver(
    kind: str, name: str, episode: Mapping[str, Any] | None = None, **options: Any
) -> RobotDriver:
    """Build (not connect) a driver.

    Args:
        kind / name: the driver kind (``DRIVER_KINDS``) and the robot's name.
        episode: run-wide episode options (``hal.driver.EPISODE_OPTIONS``); the kind gets
            those its ``episode_options`` names, the others are left out.
        options: the kind's own keyword options.

    Raises:
        ValueError: unknown ``kind`` (the message lists the known ones), an unknown episode
            option, or bad options.
    """
    cls = driver_class(kind)
    unknown = set(episode or {}) - EPISODE_OPTIONS
    if unknown:
        raise ValueError(
            f"unknown episode options {sorted(unknown)}; known: {sorted(EPISODE_OPTIONS)}"
        )
    taken = {k: v for k, v in (episode or {}).items() if k in cls.episode_options}
    try:
        driver: RobotDriver = cls(name, **taken, **options)
    except TypeError as exc:
        raise ValueError(f"driver {kind!r} for robot {name!r}: bad options: {exc}") from None
    return driver
