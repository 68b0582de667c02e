"""How a LeRobot teleoperator's options and actions meet a robot (``edge_agent.teleop``).

The ``--operator-option`` pairs become a LeRobot ``TeleoperatorConfig`` (its choice registry,
draccus-typed fields); the device's action keys are matched to the robot's per-dimension action
names; an actuated leader's feedback keys to the follower's ``observation.state``; a gamepad's
or keyboard's gripper command to the robot's gripper values. Every mismatch is a ``ValueError``
naming the keys.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from hal.lerobot_registry import find_choice_class

# robofleet's options; every other --operator-option is a field of the teleoperator's config.
OWN_OPTIONS = (
    "type",
    "module",
    "takeover_key",
    "takeover_pedal",
    "pedal_device",
    "action_map",
    "handover_s",
    "gripper_values",
)
# Devices whose "gripper" is LeRobot's GripperAction command (0 close, 1 stay, 2 open).
GRIPPER_COMMAND_TYPES = ("gamepad", "keyboard_ee")


def teleoperator_config_class(type_name: str, module: str | None = None) -> Any:
    """LeRobot's ``TeleoperatorConfig`` subclass registered as ``type_name``.

    Imports ``module`` first when given (a lab's package), then LeRobot's teleoperator
    packages and third-party ``lerobot_teleoperator_*`` plugins until one registers the name.

    Raises:
        ValueError: no config class is registered under ``type_name``; lists the known names.
    """
    from lerobot.teleoperators import TeleoperatorConfig

    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(
                f"--operator-option module={module}: cannot import it: {exc}"
            ) from None

    # Any error importing another device's package means its optional dependency is missing.
    found = find_choice_class(
        TeleoperatorConfig, "lerobot.teleoperators", type_name, skip=(Exception,)
    )
    if found is None:
        known = sorted(TeleoperatorConfig.get_known_choices())
        raise ValueError(
            f"--operator-option type={type_name}: no LeRobot teleoperator; known: {known}"
        )
    return found


def teleoperator_config(options: Mapping[str, Any]) -> Any:
    """The ``TeleoperatorConfig`` that ``options`` (``--operator-option`` pairs) describe.

    Raises:
        ValueError: no ``type``, an unknown type, a field the config does not have (listing
            the known ones) or a value draccus cannot parse to the field's type.
    """
    import draccus

    type_name = options.get("type")
    if not type_name:
        raise ValueError("--operator lerobot needs --operator-option type=NAME (e.g. so101_leader)")
    module = options.get("module")
    cls = teleoperator_config_class(str(type_name), str(module) if module else None)
    fields = {k: v for k, v in options.items() if k not in OWN_OPTIONS}
    known = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ValueError(
            f"--operator-option {', '.join(unknown)}: not a field of LeRobot's {type_name} "
            f"teleoperator ({cls.__name__}); its fields: {known}; robofleet's: {list(OWN_OPTIONS)}"
        )
    try:
        return draccus.decode(cls, fields)
    except Exception as exc:  # draccus raises several parsing error types
        raise ValueError(
            f"--operator-option: bad {type_name} teleoperator config {fields}: {exc}"
        ) from None


def device_action_names(teleop: Any, type_name: str) -> list[str]:
    """The keys of the device's ``get_action()`` in its own order, from ``action_features``.

    Raises:
        ValueError: the device does not describe a float action.
    """
    try:
        features = dict(teleop.action_features)
    except Exception as exc:  # a device class whose features cannot be read
        raise ValueError(
            f"LeRobot's {type_name} teleoperator does not describe its action "
            f"({type(exc).__name__}: {exc}); for end-effector keys use type=keyboard_ee"
        ) from None
    if "names" in features and "shape" in features:  # {"dtype", "shape", "names"} form
        names = features["names"]
        if isinstance(names, Mapping):
            return [str(k) for k, _ in sorted(names.items(), key=lambda kv: kv[1])]
        return [str(n) for n in names]
    not_float = sorted(k for k, v in features.items() if v is not float)
    if not features or not_float:
        raise ValueError(
            f"LeRobot's {type_name} teleoperator gives no float action to map "
            f"(features {features}); robofleet maps float action keys only"
        )
    return list(features)


def robot_action_names(action_features: Mapping[str, Any]) -> list[str]:
    """The per-dimension names of a robot's single ``action`` vector (hal drivers' form).

    Raises:
        ValueError: the robot's action is not one vector with one name per dimension.
    """
    feat = action_features.get("action")
    names = feat.get("names") if isinstance(feat, Mapping) else None
    if set(action_features) != {"action"} or not names:
        raise ValueError(
            "--operator lerobot maps a teleoperator's action keys onto the robot's action "
            f"names, and this robot's action features name no dimensions: {dict(action_features)}"
        )
    return [str(n) for n in names]


def action_order(
    device_names: Sequence[str], robot_names: Sequence[str], action_map: Mapping[str, Any]
) -> list[str]:
    """For each robot action dimension, the device key that fills it.

    Raises:
        ValueError: a device key names no robot dimension, a robot dimension is named by no
            device key (or by two), or ``action_map`` names a key the device does not have.
    """
    stray = sorted(set(action_map) - set(device_names))
    if stray:
        raise ValueError(
            f"action_map names {stray}, which the teleoperator does not give: {list(device_names)}"
        )
    by_robot: dict[str, str] = {}
    unmatched: list[str] = []
    for key in device_names:
        target = action_map.get(key, key)
        if target is None:
            continue
        if target not in robot_names:
            unmatched.append(key if target == key else f"{key} -> {target}")
        elif target in by_robot:
            raise ValueError(
                f"teleoperator keys {by_robot[target]} and {key} both fill robot action {target}"
            )
        else:
            by_robot[target] = key
    missing = [n for n in robot_names if n not in by_robot]
    if unmatched or missing:
        raise ValueError(
            f"teleoperator action {list(device_names)} does not match the robot's action "
            f"{list(robot_names)}: no robot action for {unmatched}, no teleoperator key for "
            f'{missing}; rename with --operator-option action_map=\'{{"key": "name"}}\' '
            "(null drops a key)"
        )
    return [by_robot[n] for n in robot_names]


def feedback_index(
    teleop: Any, keys: Mapping[str, str | None], observation_features: Mapping[str, Any], name: str
) -> dict[str, int]:
    """Device feedback key -> index of the follower's matching ``observation.state`` entry.

    Raises:
        ValueError: the follower's state does not name a joint the leader is driven by.
    """
    state = observation_features.get("observation.state")
    state_names = [
        str(n) for n in (state.get("names") if isinstance(state, Mapping) else None) or []
    ]
    index: dict[str, int] = {}
    for key in teleop.feedback_features:
        target = keys.get(key, key) or key
        if target not in state_names:
            raise ValueError(
                f"teleoperator {name} is actuated, and the follower's observation.state names no "
                f"{target!r} to drive it to (state names: {state_names})"
            )
        index[key] = state_names.index(target)
    return index


def gripper_command(
    type_name: str, keys: Sequence[str], values: Any
) -> tuple[int, float, float] | None:
    """``(index, close, open)`` of the robot dimension filled by the device's gripper command.

    Raises:
        ValueError: ``gripper_values`` is not ``none`` or a JSON list of two numbers.
    """
    if "gripper" not in keys or values in (None, "none"):
        return None
    if values == "default":
        if type_name not in GRIPPER_COMMAND_TYPES:
            return None
        values = [1.0, -1.0]
    parsed = values
    if isinstance(values, str):
        with contextlib.suppress(json.JSONDecodeError):
            parsed = json.loads(values)
    if not (
        isinstance(parsed, list)
        and len(parsed) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in parsed)
    ):
        raise ValueError(
            f"--operator-option gripper_values={values!r}: expected [close, open] (two numbers) "
            "or none"
        )
    return keys.index("gripper"), float(parsed[0]), float(parsed[1])


def state_indices(keys: Sequence[str], observation_features: Mapping[str, Any]) -> list[int] | None:
    """Each action dimension's index in ``observation.state`` when every one is there by
    name (joint targets), else None (deltas)."""
    state = observation_features.get("observation.state")
    names = [str(n) for n in (state.get("names") if isinstance(state, Mapping) else None) or []]
    if not names or any(k not in names for k in keys):
        return None
    return [names.index(k) for k in keys]
