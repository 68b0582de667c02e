"""Finding a LeRobot config class by its registered name (draccus's choice registry).

LeRobot registers a robot's or teleoperator's config class when its package is imported, so
a name may be unknown until the right package is: LeRobot's own packages are imported one by
one, then third-party ``lerobot_*`` plugins, until one registers it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any


def find_choice_class(
    base: Any,
    package: str,
    type_name: str,
    skip: tuple[type[BaseException], ...] = (ImportError,),
) -> Any | None:
    """``base``'s subclass registered as ``type_name`` (e.g. ``RobotConfig``, package
    ``lerobot.robots``), or None when nothing registers it.

    Args:
        skip: errors importing one of ``package``'s subpackages that mean only that another
            device's optional dependency is missing (that subpackage is passed over).
    """

    def lookup() -> Any:
        try:
            return base.get_choice_class(type_name)
        except KeyError:
            return None

    found = lookup()
    if found is None:
        pkg = importlib.import_module(package)
        for info in pkgutil.iter_modules(pkg.__path__):
            try:
                importlib.import_module(f"{package}.{info.name}")
            except skip:
                continue
            found = lookup()
            if found is not None:
                break
    if found is None:
        from lerobot.utils.import_utils import register_third_party_plugins

        register_third_party_plugins()
        found = lookup()
    return found
