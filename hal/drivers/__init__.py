"""Driver registry: ``make_driver(kind, name, **options)`` builds a driver by its kind.

A kind is one of the built-in ``DRIVER_KINDS`` (``metaworld``, ``gymnasium``, ``lerobot``,
``ros2``), or a lab's own driver (a plugin): the name of a ``robofleet.drivers`` entry point
(a package declares ``[project.entry-points."robofleet.drivers"] my-arm =
"my_pkg.arms:MyArm"``, as LeRobot takes third-party ``lerobot_robot_*`` packages), or a
``module.path:ClassName`` reference. Modules are imported lazily so an edge computer without,
say, MuJoCo can still run a LeRobot arm. A plugin that cannot be used is refused with a
ValueError naming it and what went wrong.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hal.driver import EPISODE_OPTIONS, RobotDriver
from hal.spec import RobotSpec

DRIVER_KINDS: dict[str, str] = {
    "metaworld": "hal.drivers.metaworld:MetaWorldDriver",
    "gymnasium": "hal.drivers.gym:GymnasiumDriver",
    "lerobot": "hal.drivers.lerobot:LeRobotDriver",
    "ros2": "hal.drivers.ros2:Ros2Driver",
}

ENTRY_POINT_GROUP = "robofleet.drivers"

KINDS_HELP = (
    f"built-in kinds: {', '.join(sorted(DRIVER_KINDS))}; or a lab's own RobotDriver "
    f"subclass: a {ENTRY_POINT_GROUP} entry point name or module.path:ClassName"
)

_REF_RE = re.compile(
    r"^(?P<module>[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)$"
)


def is_builtin(kind: str) -> bool:
    """Whether ``kind`` is one of ``DRIVER_KINDS`` (not a plugin)."""
    return kind in DRIVER_KINDS


def plugin_entry_points() -> dict[str, str]:
    """The installed ``robofleet.drivers`` entry points: name -> ``module:Class`` reference."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def driver_class(kind: str) -> type[RobotDriver]:
    """The driver class of ``kind`` (its module imported): a built-in kind, else a
    ``robofleet.drivers`` entry point of that name, else a ``module.path:ClassName`` reference.

    Raises:
        ValueError: an unknown kind (the message lists the built-in ones and the plugin
            forms), or a plugin that cannot be used: its module is not found, importing it
            raised, it has no such attribute, or that is not a concrete ``RobotDriver``
            subclass (the message names the plugin reference).
    """
    builtin = DRIVER_KINDS.get(kind)
    if builtin is not None:
        module, cls_name = builtin.split(":")
        cls: type[RobotDriver] = getattr(importlib.import_module(module), cls_name)
        return cls
    points = [
        ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == kind
    ]
    values = sorted({ep.value for ep in points})
    if len(values) > 1:
        raise ValueError(
            f"driver plugin {kind!r}: {len(values)} {ENTRY_POINT_GROUP} entry points of that "
            f"name ({values}); uninstall one or pass module.path:ClassName"
        )
    if values:
        return _load(values[0], f"driver plugin {kind!r} (entry point {values[0]!r})")
    if ":" in kind:
        return _load(kind, f"driver plugin {kind!r}")
    raise ValueError(f"unknown driver kind {kind!r}; {KINDS_HELP}")


def _load(ref: str, what: str) -> type[RobotDriver]:
    """The ``RobotDriver`` subclass ``ref`` (``module.path:Attr.Path``) names; ``what`` names
    the plugin in errors."""
    match = _REF_RE.match(ref)
    if match is None:
        raise ValueError(f"{what}: not a module.path:ClassName reference")
    module_name, attr = match.group("module"), match.group("attr")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise ValueError(
                f"{what}: module {module_name!r} not found (is its package installed or on "
                "PYTHONPATH?)"
            ) from None
        raise ValueError(f"{what}: importing {module_name!r} raised {exc!r}") from exc
    except Exception as exc:  # a plugin's import may raise anything; name it
        raise ValueError(f"{what}: importing {module_name!r} raised {exc!r}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, RobotDriver)):
        kind = f"class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
        raise ValueError(f"{what}: {ref} is {kind}, not a subclass of hal.driver.RobotDriver")
    if inspect.isabstract(obj):
        missing_hooks = sorted(getattr(obj, "__abstractmethods__", ()))
        raise ValueError(f"{what}: {ref} is abstract (it does not implement {missing_hooks})")
    return obj


def make_driver(
    kind: str, name: str, episode: Mapping[str, Any] | None = None, **options: Any
) -> RobotDriver:
    """Build (not connect) a driver.

    Args:
        kind / name: the driver kind (see ``driver_class``) and the robot's name.
        episode: run-wide episode options (``hal.driver.EPISODE_OPTIONS``); the kind gets
            those its ``episode_options`` names, the others are left out.
        options: the kind's own keyword options.

    Raises:
        ValueError: unknown ``kind`` or an unusable plugin (named, see ``driver_class``), an
            unknown episode option, or bad options; for a plugin also a constructor that
            raised anything or left no valid ``spec`` (a ``hal.spec.RobotSpec``).
    """
    cls = driver_class(kind)
    unknown = set(episode or {}) - EPISODE_OPTIONS
    if unknown:
        raise ValueError(
            f"unknown episode options {sorted(unknown)}; known: {sorted(EPISODE_OPTIONS)}"
        )
    taken = {k: v for k, v in (episode or {}).items() if k in cls.episode_options}
    if is_builtin(kind):
        try:
            driver: RobotDriver = cls(name, **taken, **options)
        except TypeError as exc:
            raise ValueError(f"driver {kind!r} for robot {name!r}: bad options: {exc}") from None
        return driver
    what = f"driver plugin {kind!r} for robot {name!r}"
    try:
        driver = cls(name, **taken, **options)
    except Exception as exc:  # a lab's constructor may raise anything; name the plugin
        raise ValueError(
            f"{what}: its constructor failed with options {sorted({**taken, **options})}: {exc!r}"
        ) from exc
    spec = getattr(driver, "spec", None)
    if not isinstance(spec, RobotSpec):
        raise ValueError(
            f"{what}: its spec is {type(spec).__name__}, not a hal.spec.RobotSpec (set "
            "self.spec in __init__)"
        )
    try:  # a spec built with model_construct skips validation; validate it here
        RobotSpec.from_dict(spec.to_dict())
    except ValueError as exc:
        raise ValueError(f"{what}: its spec is invalid: {exc}") from None
    return driver


def parse_options(pairs: Sequence[str], flag: str = "--driver-option") -> dict[str, Any]:
    """``KEY=VALUE`` strings as driver options; a VALUE that parses as JSON is taken as
    JSON (numbers, lists, objects), any other as a string.

    Raises:
        ValueError: an item without ``=`` or with an empty key, named with ``flag``.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} {pair!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out
